"""HTTP routes, one module per concern; the app factory includes every router listed here."""

from service.routes import classify, health, metrics, models, translate

ROUTERS = [classify.router, translate.router, models.router, health.router, metrics.router]
