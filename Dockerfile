# One image for every role: the compose file runs `agent-engine serve|worker|clock|migrate`.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 AGENT_ENGINE_LOG_FORMAT=json
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY migrations ./migrations
COPY schema ./schema
RUN pip install --no-cache-dir -e . \
    && useradd --system --home /app agent \
    && chown -R agent /app
USER agent
EXPOSE 8000
ENTRYPOINT ["agent-engine"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
