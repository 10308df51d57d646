# protoflask: gunicorn's gevent worker serving wsgi:app (config from the environment).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protoflask ./protoflask
RUN pip install --no-cache-dir .
COPY wsgi.py gunicorn.conf.py ./
ENV HOST=0.0.0.0 PORT=8080
EXPOSE 8080
# JWT_SECRET must be supplied at run time: docker run -e JWT_SECRET=... -p 8080:8080 protoflask
CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
