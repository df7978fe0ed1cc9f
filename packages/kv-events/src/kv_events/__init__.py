"""kvcore's KV-cache events on the wire (vLLM's ZeroMQ format, as Dynamo's KV router reads it):
docs/events.md."""

from kv_events.mapping import WireMapper
from kv_events.publisher import EventPublisher
from kv_events.subscriber import EventSubscriber

__all__ = ["EventPublisher", "EventSubscriber", "WireMapper"]
