"""Every HTTP route of the service, one module per concern; the router serves exactly this list."""

from service.http.routes import attention, classify, docs, health, metrics, models, oip, oip_extensions, translate, web

ROUTES = [
    *classify.ROUTES,
    *translate.ROUTES,
    *attention.ROUTES,
    *models.ROUTES,
    *health.ROUTES,
    *metrics.ROUTES,
    *oip.ROUTES,
    *oip_extensions.ROUTES,
    *web.ROUTES,
    *docs.ROUTES,
]
