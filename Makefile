# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install everything they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-deps kafka-jars spark-kafka-jars lint soak clean screenshots

# eventlane itself, then the sample app (a distribution of its own: example_apps/pyproject.toml).
# OpenSSL's and libsodium's headers (Debian's libssl-dev, libsodium-dev) first: setup.py's
# eventlane.codec._seal links libcrypto, and libsodium for its AES-256-GCM when present.
$(STAMP): pyproject.toml setup.py example_apps/pyproject.toml
	@test -f /usr/include/openssl/evp.h || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev >/dev/null)
	@test -f /usr/include/sodium.h || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsodium-dev >/dev/null)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	$(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e example_apps
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/eventlane demo invoicing --data ./demo-data

lint: $(STAMP)
	$(BIN)/ruff check eventlane tests benchmarks example_apps
	$(BIN)/mypy
	$(BIN)/lint-imports

# System packages the tests drive (Debian): installed once, quietly, when missing: kcat (Kafka
# listener tests), strace (power-loss explorer), chromium + chromium-driver (the console's
# browser tests, tests/console/), maven (+ its JDK) for Apache Kafka's jars (Kafka's own tools
# judge the listener: tests/kafka/test_kafka_tools.py), iproute2 (`ip netns`: the JetStream
# partition tests' simulated hosts), postgresql (initdb/pg_ctl: the PostgreSQL read-model
# tests start a temporary cluster). Nothing is downloaded at test run time.
test-deps:
	@test -f /usr/include/sodium.h || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsodium-dev >/dev/null)
	@command -v ip >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null)
	@command -v mvn >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null)
	@$(MAKE) --no-print-directory kafka-jars
	@$(MAKE) --no-print-directory spark-kafka-jars
	@command -v kcat >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq kcat >/dev/null)
	@command -v strace >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq strace >/dev/null)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

# Apache Kafka's jars (tools/kafka/pom.xml) from Maven Central into tools/kafka/lib, fetched
# again when the pom changes; tools/kafka/jars.py gives their classpath to tests.
KAFKA_LIB := tools/kafka/lib
$(KAFKA_LIB)/.stamp: tools/kafka/pom.xml
	rm -rf $(KAFKA_LIB)
	mvn -q -B -f tools/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime
	touch $@

kafka-jars: $(KAFKA_LIB)/.stamp

# Spark's Kafka source (tools/spark-kafka/pom.xml): the connector and the jars pyspark lacks
# (not Scala, Hadoop or compression codecs, which pyspark ships), for bench_kafka_spark.py.
SPARK_KAFKA_LIB := tools/spark-kafka/lib
$(SPARK_KAFKA_LIB)/.stamp: tools/spark-kafka/pom.xml
	rm -rf $(SPARK_KAFKA_LIB)
	mvn -q -B -f tools/spark-kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=lib \
	  -DincludeScope=runtime -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2
	touch $@

spark-kafka-jars: $(SPARK_KAFKA_LIB)/.stamp

test: lint test-deps
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# Re-take the screenshots of docs/console.md (docs/img/console-*.png) with the browser tests.
screenshots: $(STAMP) test-deps
	EVENTLANE_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/console

soak: $(STAMP) test-deps
	$(BIN)/python -m pytest -q -m soak

clean:
	rm -rf $(VENV) build *.egg-info demo-data
