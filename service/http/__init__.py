"""The HTTP transport over the serving core: one app, one middleware stack, one router, the routes it serves.

A peer of ``service/grpc/``, which it never imports; the process (``service/process.py``) runs both.
"""
