"""MQTT transport of the testbed: topics, brokers (embedded amqtt, Mosquitto), ACLs and a client.

Import the submodules you need (`testbed.mqtt.topics`, `.client`, `.broker`, `.acl`); this package
imports nothing, so a node does not pull in the broker. docs/wire-protocol.md describes the protocol.
"""
