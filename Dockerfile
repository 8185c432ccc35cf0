# A training base image whose ENTRYPOINT proves the GPU pin before the workload starts.
#
#   make image                                   # wheels into build/wheels, then docker build (offline)
#   make image BASE=nvcr.io/nvidia/pytorch:24.08-py3
#   docker run --gpus device=GPU-... gpupin:latest python3 train.py
#
# The image gets only the entrypoint side of gpupin (gpupin-entrypoint and nvidia-ml-py; no docker SDK), from
# the wheels `make wheels` prepared: the build needs no network.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

COPY build/wheels/ /tmp/gpupin-wheels/
# PIP_BREAK_SYSTEM_PACKAGES: Debian-based images mark their Python as externally managed (PEP 668); images
# with their own Python ignore it.
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /tmp/gpupin-wheels gpupin \
    && rm -rf /tmp/gpupin-wheels \
    && gpupin-entrypoint --version

# cuda: NVML and the CUDA driver must both agree that cuda:k is expected card k (torch: also ask torch).
ENV GPUPIN_VERIFY=cuda
ENTRYPOINT ["gpupin-entrypoint"]
# The example workload: say what each cuda:k is, from inside the process, checked against the expectation.
CMD ["python3", "-m", "gpupin.entrypoint"]
