#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and RabbitMQ (127.0.0.1:5672) are up on this machine,
# starting them if they are down; then wait (bounded) until both accept connections.
# Idempotent: running it with both services up changes nothing.
set -euo pipefail

PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
AMQP_HOST=${AMQP_HOST:-127.0.0.1}
AMQP_PORT=${AMQP_PORT:-5672}
WAIT_S=${SERVICES_WAIT_S:-90}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

pg_ready() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT"
  else
    port_open "$PG_HOST" "$PG_PORT"
  fi
}

amqp_ready() {
  # The port opens before the broker finishes booting; ask the node when we can.
  port_open "$AMQP_HOST" "$AMQP_PORT" || return 1
  if command -v rabbitmq-diagnostics >/dev/null 2>&1; then
    rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1
  fi
}

apt_install() {
  # A machine without the service: install it from Debian's packages (needs root).
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing $*"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  else
    echo "services: $* missing and cannot be installed here (need root and apt-get)" >&2
    return 1
  fi
}

start_pg() {
  command -v pg_ctlcluster >/dev/null 2>&1 || apt_install postgresql postgresql-contrib
  local version
  for version in $(ls /etc/postgresql 2>/dev/null); do
    echo "services: starting PostgreSQL $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
}

start_amqp() {
  command -v rabbitmq-server >/dev/null 2>&1 || apt_install rabbitmq-server
  if rabbitmqctl -q --timeout 10 ping >/dev/null 2>&1; then
    # The Erlang node runs but the broker application is stopped (rabbitmqctl stop_app).
    echo "services: starting the RabbitMQ application"
    rabbitmqctl -q start_app || true
  else
    echo "services: starting RabbitMQ"
    rabbitmq-server -detached || true
  fi
}

wait_for() {
  local name=$1 probe=$2 deadline=$((SECONDS + WAIT_S))
  until "$probe"; do
    if (( SECONDS >= deadline )); then
      echo "services: $name did not accept connections within ${WAIT_S}s" >&2
      return 1
    fi
    sleep 1
  done
  echo "services: $name is up"
}

pg_ready || start_pg
amqp_ready || start_amqp
wait_for "PostgreSQL ($PG_HOST:$PG_PORT)" pg_ready
wait_for "RabbitMQ ($AMQP_HOST:$AMQP_PORT)" amqp_ready
