"""--gpu-pod-selector follows the pods (sidecar/pod_watch.py): a watch of the selected pods and of the exporter's
EndpointSlices, each event a new resolution, a resync (list again) when the watch's version is gone (410). The
client's own `kubernetes.watch.Watch` reads the API server's wire form: here the recorded pod list, edited as a
pod moves, and watch lines in the form the API server streams them (tests/kube/data/watch_gone.jsonl is its 410).
The API calls made are exactly what the generated Roles allow."""

from __future__ import annotations

import copy
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kubernetes.client import V1EndpointSliceList, V1PodList

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.events import PodsResolved
from bridge.kube.rbac import rbac_objects
from bridge.sidecar.pod_discovery import follow, with_selected_pods
from tests.kube.test_pod_discovery import DATA

EXPORTERS = "k8s://gpu-operator/nvidia-dcgm-exporter"
NODE_C = "http://10.0.3.9:9400/metrics"


class _Streamed:
    """A watch response as urllib3 hands it to the client: the lines the API server streamed, then the end of the
    watch's time."""

    status = 200

    def __init__(self, lines: Sequence[bytes]) -> None:
        self.lines = list(lines)

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.lines

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FollowedApi:
    """CoreV1Api.list_namespaced_pod and DiscoveryV1Api.list_namespaced_endpoint_slice over the recorded bodies; the
    pods can be moved, and the lines a pod watch streams are queued by the test (a watch with none queued ends
    empty, as one whose time is up). Every call is kept as (verb, API group, resource, namespace)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.pods: dict[str, Any] = json.loads((DATA / "pods_app_llama.json").read_text())
        self.streams: queue.Queue[list[bytes]] = queue.Queue()
        self._lock = threading.Lock()

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> V1PodList:
        if kwargs.get("watch"):
            self.calls.append(("watch", "", "pods", namespace))
            try:
                return _Streamed(self.streams.get(timeout=0.05))  # type: ignore[return-value]
            except queue.Empty:
                return _Streamed([])  # type: ignore[return-value]
        self.calls.append(("list", "", "pods", namespace))
        with self._lock:
            return V1PodList.model_validate(copy.deepcopy(self.pods))

    def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> V1EndpointSliceList:
        if kwargs.get("watch"):
            self.calls.append(("watch", "discovery.k8s.io", "endpointslices", namespace))
            time.sleep(0.05)
            return _Streamed([])  # type: ignore[return-value]
        self.calls.append(("list", "discovery.k8s.io", "endpointslices", namespace))
        return V1EndpointSliceList.model_validate(json.loads((DATA / "endpointslices_dcgm_exporter.json").read_text()))

    def move(self, name: str, node: str, new_name: str, *, stream: bool = True) -> None:
        """A Deployment's pod rescheduled: `name` deleted, `new_name` running on `node`; the watch streams both
        (unless `stream` is false: events the watch missed)."""
        with self._lock:
            items = self.pods["items"]
            old = next(p for p in items if p["metadata"]["name"] == name)
            items.remove(old)
            new = copy.deepcopy(old)
            new["metadata"].update(name=new_name, resourceVersion=str(int(old["metadata"]["resourceVersion"]) + 900))
            new["spec"]["nodeName"] = node
            items.append(new)
        if stream:
            self.streams.put([_event("DELETED", old), _event("ADDED", new)])


def _event(kind: str, pod: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": {"apiVersion": "v1", "kind": "Pod", **pod}}).encode() + b"\n"


class Followed:
    """The session's side (`Session.follow_pods`): what the watch handed over."""

    def __init__(self) -> None:
        self.changes: list[tuple[list[str], list[str], PodsResolved]] = []
        self.scraped: set[str] = set()
        self.at_start: set[str] = set()

    def follow_pods(self, urls: Sequence[str], pods: Sequence[str], event: PodsResolved) -> list[str]:
        added = [u for u in urls if u not in self.scraped]
        self.scraped.update(urls)
        self.changes.append((list(urls), list(pods), event))
        return added


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not check():
        assert time.monotonic() < deadline, f"no {what} within 10 s"
        time.sleep(0.01)


def _start(api: Any, slices: Any = None) -> tuple[Followed, Any]:
    config = Config(telemetry=TelemetryItems(discovery=[EXPORTERS]))
    selected = with_selected_pods(config, ["bench/app=llama"], api, slices or api)
    followed = Followed()
    followed.scraped.update(selected.config.telemetry.urls)
    followed.at_start = set(followed.scraped)
    return followed, follow(followed, selected, api, slices or api, now_ns=lambda: 99, watch_s=1, pause_s=0.05)


def _pod_watches(api: FollowedApi) -> int:
    return sum(call[:3] == ("watch", "", "pods") for call in api.calls)


def _watching(api: FollowedApi, more: int = 1) -> None:
    """Until the pods have been watched `more` times more, and the EndpointSlices once."""
    start = _pod_watches(api)
    _wait(lambda: _pod_watches(api) >= start + more and any(c[0] == "watch" and c[2] == "endpointslices"
                                                             for c in api.calls), "watches")


def test_a_pod_rescheduled_to_another_node_brings_that_nodes_exporter_in_and_its_new_name_into_the_selection(
        caplog: Any) -> None:
    api = FollowedApi()
    followed, watch = _start(api)
    try:
        _watching(api)
        api.move("llama-1", "gpu-node-c", "llama-1-5f7c9")
        _wait(lambda: bool(followed.changes), "change")
    finally:
        watch.stop(timeout_s=1.0)
    assert not [r for r in caplog.records if r.name == "bridge.sidecar.pod_watch"]  # the watch's events, no resync
    urls, pods, event = followed.changes[0]
    assert NODE_C not in followed.at_start and NODE_C in urls
    assert pods == ["bench/llama-0", "bench/llama-1-5f7c9"]
    assert [(p.name, p.node) for p in event.pods] == [("llama-0", "gpu-node-a"), ("llama-1-5f7c9", "gpu-node-c")]
    assert event.selectors == ("bench/app=llama",) and event.time_ns == 99


def test_a_watch_whose_version_is_gone_lists_again_and_catches_up_with_what_it_missed(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="bridge.sidecar.pod_watch")
    api = FollowedApi()
    followed, watch = _start(api)
    try:
        _watching(api)
        api.move("llama-1", "gpu-node-c", "llama-1-5f7c9", stream=False)  # events the watch never streams
        _watching(api, more=3)  # (watches that end empty resolve nothing)
        assert followed.changes == []
        api.streams.put([(DATA / "watch_gone.jsonl").read_bytes()])  # then: 410, that version was compacted away
        _wait(lambda: bool(followed.changes), "change after the resync")
    finally:
        watch.stop(timeout_s=1.0)
    assert followed.changes[0][1] == ["bench/llama-0", "bench/llama-1-5f7c9"]
    said = [r.getMessage() for r in caplog.records if r.name == "bridge.sidecar.pod_watch"]
    assert said == ["pods bench/app=llama: the watch's version is gone (410): listing again"]


def test_the_watchs_api_calls_are_exactly_what_the_generated_roles_allow() -> None:
    api = FollowedApi()
    followed, watch = _start(api)
    try:
        _wait(lambda: {c[0] for c in api.calls} == {"list", "watch"} and len({c[2] for c in api.calls
                                                                               if c[0] == "watch"}) == 2, "watches")
    finally:
        watch.stop(timeout_s=1.0)
    roles = [o for o in rbac_objects("bench-1", "bench", "gpu-operator", {}) if o["kind"] == "Role"]
    allowed = {(verb, group, resource, role["metadata"]["namespace"])
               for role in roles for rule in role["rules"]
               for verb in rule["verbs"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert set(api.calls) <= allowed
    assert {(v, r) for v, _, r, _ in api.calls} == {("list", "pods"), ("watch", "pods"), ("list", "endpointslices"),
                                                     ("watch", "endpointslices")}
    assert followed.changes == []  # nothing moved: nothing handed over


class _WatchRefused(FollowedApi):
    """A Role without `watch`: the lists answer, every watch is refused (403)."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> V1PodList:
        if kwargs.get("watch"):
            from kubernetes.client.exceptions import ApiException

            self.calls.append(("watch", "", "pods", namespace))
            raise ApiException(status=403, reason="Forbidden")
        return super().list_namespaced_pod(namespace, **kwargs)


def test_a_refused_watch_is_said_once_and_tried_again_after_a_pause(caplog: Any) -> None:
    api = _WatchRefused()
    with caplog.at_level(logging.WARNING, logger="bridge.sidecar.pod_watch"):
        followed, watch = _start(api)
        try:
            _wait(lambda: sum(c[:3] == ("watch", "", "pods") for c in api.calls) >= 3, "three refused watches")
        finally:
            watch.stop(timeout_s=1.0)
    said = [r.getMessage() for r in caplog.records if r.name == "bridge.sidecar.pod_watch"]
    assert len(said) == 1 and "pods bench/app=llama: watching failed" in said[0] and "403" in said[0]
