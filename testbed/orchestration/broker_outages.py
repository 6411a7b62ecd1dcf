"""A broker outage at the coordinator: no publish waits longer than a round's timeout; while none
is acknowledged each round closes with every expected node straggling ("offline"), and past
``mqtt.outage_limit_s`` without the broker the run stops with one line (failed; ``testbed run
--resume`` continues it). :class:`BrokerOutages` is that part of
testbed.orchestration.coordinator.MqttNodes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from testbed.algorithms.contract import RoundContext
from testbed.errors import UserError

# The coordinator's one logger, whichever of its modules writes: what users and tests filter on.
log = logging.getLogger("testbed.orchestration.coordinator")


class BrokerOutages:
    """Publishing through an outage (a part of :class:`testbed.orchestration.coordinator.MqttNodes`:
    its ``client``, ``url``, ``round_timeout_s`` and ``_outage_since``)."""

    def _publish(self, topic: str, payload: bytes, what: str) -> bool:
        """Publish ``what`` (a round, the setup...), waiting at most a round's timeout for the broker's ack; False
        (an outage, counted against mqtt.outage_limit_s) when it is unreachable or did not ack."""
        return self._publish_then(topic, payload, what)()

    def _publish_then(self, topic: str, payload: bytes, what: str) -> Callable[[], bool]:
        """:meth:`_publish` in two halves: the publish handed to the client now; the call returned
        awaits the broker's ack (at most a round's timeout from now) and says what :meth:`_publish`
        would. A round's report is made between the two (under load the ack of a broadcast came
        7-17 ms after it, and the report waited for it into the replies' arrival)."""
        if not self.client.connected:
            self._broker_lost()
            return lambda: False
        acked = self.client.publish_then(topic, payload, timeout_s=self.round_timeout_s)

        def finish() -> bool:
            try:
                acked()
            except TimeoutError as exc:
                # paho keeps the frames and resends them after a reconnect: the nodes may still
                # run this round; their replies find it (_rounds), however late.
                log.warning("%s not sent: %s", what, exc)
                self._broker_lost()
                return False
            self._broker_back()
            return True

        return finish

    def _await_broker(self) -> None:
        """Before a round: if the broker is gone, wait for it up to a round's timeout (the client
        reconnects with backoff); raises past mqtt.outage_limit_s."""
        if self.client.connected:
            return
        self._broker_lost()
        deadline = time.monotonic() + self.round_timeout_s
        while not self.client.connected and (remaining := deadline - time.monotonic()) > 0:
            self._wait(min(remaining, 0.5))
        if not self.client.connected:
            self._broker_lost()

    def _broker_lost(self) -> None:
        """Note an outage; past the limit, stop the run (resumable) with one line."""
        now, limit = time.monotonic(), self.mqtt.outage_limit_s
        if self._outage_since is None:
            self._outage_since = now
            log.warning("broker %s unreachable: rounds close with stragglers until it is back, for at most "
                        "%g s (mqtt.outage_limit_s)", self.url, limit)
        elif now - self._outage_since > limit:
            raise UserError(f"broker {self.url} unreachable for {now - self._outage_since:.0f} s, past "
                            f"mqtt.outage_limit_s = {limit:g} s; once it is back, `testbed run --resume RUN_DIR` "
                            f"continues the run")

    def _broker_back(self) -> None:
        if self._outage_since is not None:
            log.warning("broker %s back after %.1f s", self.url, time.monotonic() - self._outage_since)
            self._outage_since = None

    @staticmethod
    def _unreached(ctx: RoundContext) -> tuple[dict, dict, dict[int, str], dict]:
        """The answers of a round the broker did not take: none, every expected node offline."""
        return {}, {}, {node: "offline" for node in ctx.expected}, {}
