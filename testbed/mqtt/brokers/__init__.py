"""Managed brokers: the MQTT brokers a run (or a test) starts and stops itself, one module each,
found by :mod:`testbed.mqtt.brokers.registry`."""
