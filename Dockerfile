# attnserve images. Targets:
#   gpu (default)  NVIDIA CUDA + cuDNN runtime with onnxruntime-gpu: the `gpu` extra of pyproject.toml
#   cpu            slim Python with onnxruntime: the `cpu` extra
# Build arguments:
#   MODELS_IMAGE     where /models comes from: the committed models/ (default), or an image made by
#                    deploy/train.Dockerfile, which retrains them from the data (hours on a CPU)
#   PYTHON_IMAGE     base of the cpu target
#   CUDA_IMAGE       base of the gpu target; its CUDA major must be the one onnxruntime-gpu was built for
#                    (checked at build time below), cuDNN 9
# docker build -t attnserve:gpu .            docker build --target cpu -t attnserve:cpu .
# Every stage here is one a runtime target needs: the legacy builder (no BuildKit) builds all the
# stages before its target, so the training stage lives in deploy/train.Dockerfile.
# The models are in /models (ATTNSERVE_MODEL_REPOSITORY); mount another repository there to override them.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG MODELS_IMAGE=models-shipped

# --- the model repository -----------------------------------------------------------------------
FROM scratch AS models-shipped
COPY models /models

FROM ${MODELS_IMAGE} AS models

# --- cpu target -----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build-cpu
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contract contract
COPY service service
RUN /opt/venv/bin/pip install --no-cache-dir '.[cpu]'

FROM ${PYTHON_IMAGE} AS cpu
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    ATTNSERVE_HOST=0.0.0.0 ATTNSERVE_PORT=8000 ATTNSERVE_GRPC_PORT=8001 ATTNSERVE_MODEL_REPOSITORY=/models
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve
COPY --from=build-cpu /opt/venv /opt/venv
COPY --from=models /models /models
WORKDIR /app
COPY contract contract
COPY service service
COPY deploy/__init__.py deploy/gpu_check.py deploy/
COPY benchmarks/translate_sentences.txt benchmarks/
USER 10001
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('ATTNSERVE_PORT', '8000'), timeout=2)"]
CMD ["python", "-m", "service"]

# --- gpu target (last: the default) -------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS build-gpu
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contract contract
COPY service service
RUN /opt/venv/bin/pip install --no-cache-dir '.[gpu]'
# onnxruntime-gpu wheels are built for one CUDA major (1.31: CUDA 13, cuDNN 9); on another the CUDA
# provider fails to load and onnxruntime falls back to the CPU. Refuse the build instead.
RUN /opt/venv/bin/python -c "import os, sys; from onnxruntime.capi import build_and_package_info as b; \
    base, wheel = os.environ['CUDA_VERSION'].split('.')[0], str(b.cuda_version).split('.')[0]; \
    sys.exit(0 if base == wheel else f'onnxruntime-gpu is built for CUDA {b.cuda_version}, the base image has {os.environ[\"CUDA_VERSION\"]}: set CUDA_IMAGE')"

FROM ${CUDA_IMAGE} AS gpu
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    ATTNSERVE_HOST=0.0.0.0 ATTNSERVE_PORT=8000 ATTNSERVE_GRPC_PORT=8001 ATTNSERVE_MODEL_REPOSITORY=/models
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve
COPY --from=build-gpu /opt/venv /opt/venv
COPY --from=models /models /models
WORKDIR /app
COPY contract contract
COPY service service
COPY deploy/__init__.py deploy/gpu_check.py deploy/
COPY benchmarks/translate_sentences.txt benchmarks/
USER 10001
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('ATTNSERVE_PORT', '8000'), timeout=2)"]
CMD ["python", "-m", "service"]
