# Flink 2.2 with Python 3.11 and scache's requirements on every JobManager/TaskManager,
# plus the Kafka SQL connector in usrlib/ (version matched to apache-flink in pyproject.toml).
FROM maven:3.9-eclipse-temurin-17 AS connector
COPY infra/flink/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DoutputDirectory=/build/jars

FROM flink:2.2.1-scala_2.12-java17
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && ln -sf /usr/bin/python3.11 /usr/bin/python3
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m pip install --break-system-packages --no-deps -r /tmp/requirements.lock
COPY --from=connector /build/jars/flink-sql-connector-kafka-*.jar /opt/flink/usrlib/
# A cluster runs Python jobs only with flink-python on its classpath; the image keeps it in opt/
# (a session cluster's JobManager otherwise rejects the job: ClassNotFoundException ...Python...).
RUN ls /opt/flink/lib/flink-python-*.jar >/dev/null 2>&1 || cp /opt/flink/opt/flink-python-*.jar /opt/flink/lib/
COPY cache_core /opt/scache/cache_core
COPY udfs /opt/scache/udfs
COPY jobs /opt/scache/jobs
ENV PYTHONPATH=/opt/scache
