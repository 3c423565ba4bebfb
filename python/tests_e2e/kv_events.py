"""A KV event subscriber as KV-aware routers (llm-d, Dynamo) run one for vLLM's publisher
(``--kv-events-config``, ZMQ): a SUB socket bound where the instances' publishers connect (their
``endpoint`` names a host, not ``*``), each message ``[topic, sequence, payload]``, the payload msgpack
``[ts, [event, ...], dp_rank]`` decoded raw, each event a map naming its ``type``."""

import threading
import time

import msgspec
import zmq


class Subscriber:
    """Collects every event published to ``endpoint``, where it listens from the start."""

    def __init__(self, endpoint, topic=""):
        self.endpoint, self.topic = endpoint, topic
        self.events, self.sequences = [], []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.bound = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.bound.wait(10), f"the subscriber could not listen at {endpoint}"

    def _run(self):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sock.bind(self.endpoint)
        self.bound.set()
        try:
            while not self.stop.is_set():
                if not sock.poll(100):
                    continue
                _, seq, payload = sock.recv_multipart()
                batch = msgspec.msgpack.decode(payload)
                with self.lock:
                    self.sequences.append(int.from_bytes(seq, "big"))
                    self.events.extend(batch[1])
        finally:
            sock.close(linger=0)
            ctx.term()

    def wait_for(self, found, limit=30):
        """Waits until ``found(events)`` (all so far) is true; its value then, or ``None`` after ``limit``."""
        deadline = time.monotonic() + limit
        while True:
            with self.lock:
                value = found(list(self.events))
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
