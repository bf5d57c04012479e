"""The HTTP side of the service: one app, one middleware stack, one router, the routes it serves."""
