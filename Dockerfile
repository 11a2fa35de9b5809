# The gpu-extender image: the package installed with pip, as `make test` installs it (but not editable, and
# without the test, load-test and docs extras), on a shell-less runtime made of Debian bookworm's own Python 3.11.
#
#   docker build -t gpu-extender .          # or: buildah bud --layers -t gpu-extender .
#   docker run --rm --read-only --tmpfs /tmp gpu-extender demo
#   docker run --rm --read-only gpu-extender --help
#
# Tested here with buildah and podman only (no Docker daemon, no registry): see image/build.sh.
#
# Two stages:
#   builder  Debian bookworm with python3 from Debian. Builds the project's wheel and its dependencies' wheels
#            (pip, from PyPI), installs them into the virtual environment /opt/venv without pip, and stages in
#            /rootfs the files of Debian's python3.11 and the libraries it needs (image/runtime-rootfs.sh): no
#            shell, no package manager. Everything is compiled to bytecode here, then the staged tree is run
#            once (chroot, as user 65532) to check that it imports and starts.
#   runtime  FROM scratch: the staged tree and the virtual environment, user 65532, nothing else. It writes
#            nothing at run time (PYTHONDONTWRITEBYTECODE, bytecode precompiled), so it runs with a read-only
#            root filesystem; `extender demo` alone needs a writable /tmp (its certificates), as does a
#            kubeconfig with inline client certificate data (give an emptyDir, or `--tmpfs /tmp`).
#
# DEBIAN_IMAGE is the builder's base. Where Docker Hub is reachable the default is right; image/build.sh builds
# a bookworm base with debootstrap instead (a machine with Debian's mirror but no container registry).

ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS builder

# Only for a build behind a TLS-intercepting proxy or with a PyPI mirror: a CA bundle path visible during the
# build (mounted by the builder, e.g. `buildah bud -v /etc/ssl/certs/ca-certificates.crt:/run/pip-ca.crt:ro`)
# and an index URL. Neither is needed with direct access to PyPI, and neither reaches the runtime stage.
ARG PIP_CERT=""
ARG PIP_INDEX_URL=""

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/*

# The runtime's root filesystem: depends only on Debian's packages, so this layer is cached across code changes.
# libstdc++6: numpy's manylinux wheel links it (its bundled OpenBLAS and gfortran are in numpy.libs, libstdc++
# is the system's); without it `extender serve` fails at its first import of the placement arrays.
COPY image/runtime-rootfs.sh /usr/local/bin/runtime-rootfs
RUN sh /usr/local/bin/runtime-rootfs /rootfs python3.11-minimal libpython3.11-stdlib libstdc++6

# Wheels of the project and of every dependency (PyPI's manylinux wheels: no compiler needed), then the
# virtual environment from those wheels alone. The venv's interpreter is /usr/bin/python3.11, which the
# runtime has at the same path. pip and setuptools are removed from it: nothing installs at run time.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extender ./extender
RUN [ -n "$PIP_CERT" ] || unset PIP_CERT; [ -n "$PIP_INDEX_URL" ] || unset PIP_INDEX_URL; \
    set -e \
    && /usr/bin/python3.11 -m venv /opt/venv \
    && /opt/venv/bin/pip wheel --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-index --find-links /wheels gpu-extender \
    && /opt/venv/bin/pip uninstall -y pip setuptools \
    && find /opt/venv -name __pycache__ -type d -prune -exec rm -rf {} + \
    && /usr/bin/python3.11 -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv/lib \
    && ls /wheels

# Check the runtime tree before it becomes the image: as user 65532, with no shell in it, import every
# compiled dependency (numpy, and `serve`'s modules that import it) and run the CLI. PYTHONDONTWRITEBYTECODE
# keeps the check from writing into the tree; the check runs on a copy all the same.
RUN cp -a /rootfs /check && cp -a /opt/venv /check/opt/venv \
    && for tool in sh bash dash env dpkg apt-get; do test ! -e "/check/usr/bin/$tool" || exit 1; done \
    && env -i PYTHONDONTWRITEBYTECODE=1 PATH=/opt/venv/bin:/usr/bin /usr/sbin/chroot --userspec=65532:65532 /check \
        /opt/venv/bin/python -c "import ssl, sqlite3, uuid, zoneinfo; import aiohttp, httptools, orjson, pydantic, \
yaml, prometheus_client, cryptography.x509, uvloop, numpy, extender.cli, extender.app; assert yaml.__with_libyaml__; \
print('runtime tree ok:', ssl.OPENSSL_VERSION)" \
    && env -i PYTHONDONTWRITEBYTECODE=1 PATH=/opt/venv/bin:/usr/bin /usr/sbin/chroot --userspec=65532:65532 /check \
        /opt/venv/bin/extender --help > /dev/null \
    && rm -rf /check


FROM scratch AS runtime

ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""

LABEL org.opencontainers.image.title="gpu-extender" \
      org.opencontainers.image.description="A Kubernetes scheduler extender for GPU sharing: filter, prioritize, bind and preempt by GPU memory, over HTTPS." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /rootfs/ /
COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:/usr/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    LANG=C.UTF-8 \
    HOME=/home/nonroot \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8443 8081

ENTRYPOINT ["extender"]
CMD ["serve"]
