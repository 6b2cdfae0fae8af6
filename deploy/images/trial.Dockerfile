# cairn's trial image: Python 3.11, torch (CPU), numpy and the cairn package trials import
# (`cairn.core`) with its core dependencies, and the extras of the tasks that run in it
# (JupyterLab, TensorBoard, aiohttp for the shell server): no PostgreSQL, nats-server, boto3,
# optuna or docker SDK (those are cairn[server]'s). Built FROM the offline base image by
# build.sh, from wheels gathered on the host (every one is installed). torch comes in its own
# layer, so a change to cairn alone rebuilds only the last one.
ARG BASE
FROM ${BASE}
COPY torch-wheels /tmp/torch-wheels
RUN python3 -m venv /opt/cairn \
 && /opt/cairn/bin/pip install --no-index --no-cache-dir --find-links /tmp/torch-wheels /tmp/torch-wheels/*.whl \
 && rm -rf /tmp/torch-wheels \
 && chmod 1777 /tmp
COPY wheels /tmp/wheels
RUN /opt/cairn/bin/pip install --no-index --no-cache-dir --find-links /tmp/wheels /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
ENV PATH=/opt/cairn/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
ENTRYPOINT ["/usr/bin/tini", "-g", "--"]
CMD ["python3"]
