# The model repository retrained from the data by `make models` (hours on a CPU), as an image that
# holds only /models, for the runtime images to copy instead of the committed models/:
#   docker build -f deploy/train.Dockerfile --build-arg PROFILE=default -t attnserve-models:trained .
#   docker build --build-arg MODELS_IMAGE=attnserve-models:trained -t attnserve:gpu .
# Build arguments:
#   PYTHON_IMAGE     base of the training stage (Debian: the data are Debian packages)
#   PROFILE          training profile (default, tiny)
#   TORCH_INDEX_URL  where the CPU build of torch comes from
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS models-trained
ARG PROFILE=default
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md Makefile ./
COPY model model
COPY export export
COPY contract contract
COPY service service
COPY client client
# install-dev: .[cpu,train,export,test] in .venv and Fashion-MNIST (apt: dataset-fashion-mnist); the corpus
# step fetches the Debian packages it reads with apt-get download. The test system packages
# (SYSTEM_DEPS) are not needed to train.
RUN PIP_EXTRA_INDEX_URL=${TORCH_INDEX_URL} make models MODELS=/models PROFILE=${PROFILE} SYSTEM_DEPS=

FROM scratch AS models
COPY --from=models-trained /models /models
