"""The Open Inference Protocol (KServe v2) whatever the transport: its tensors, its operations and
Triton's model configuration (``model_config.py``).

REST (``service/http/oip.py``, ``service/http/routes/oip*.py``) and gRPC (``service/grpc/``) only
translate their wire format to and from these, so both reach the same queues with the same
validation, limits, errors and deadlines.
"""
