"""HTTP routes, one module per concern; the app factory includes every router listed here."""

from service.routes import attention, classify, health, metrics, models, translate, web

ROUTERS = [
    classify.router,
    translate.router,
    attention.router,
    models.router,
    health.router,
    metrics.router,
    web.router,
]
