"""Embedded single-node Kafka: jar resolution, broker launcher, topic setup."""
