"""Following the pods a `--gpu-pod-selector` selects (issue 31): a watch of those pods and of the exporter's
EndpointSlices; whenever one of them changes, the selection is resolved again (discovery.pod_endpoints) and,
when the pods or the exporter endpoints on their nodes are not what they were, handed to `on_change`
(sidecar/pod_discovery.py: new pods join the selection, new endpoints are scraped, the pods go to the events file).

    list ─▶ its resourceVersion ─▶ watch from it ─▶ each event: resolve again
      ▲                                 │ the watch's time is up (timeout_seconds): watch on from the last version
      └─ resync: list again ◀───────────┘ 410 Gone (that version was compacted away), or a failure (after a pause)

Level-triggered, as Kubernetes' controllers are: an event only says "look again", so an event missed (a 410, a
dropped connection) costs nothing that the resync's list does not make good. The watch needs `watch` beside
`list` on pods and EndpointSlices, which the Roles `kube profile` generates grant (kube/rbac.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from bridge.discovery import SERVICE_NAME_LABEL, DiscoveryError, PodEndpoints, PodSelector, ServiceRef, pod_endpoints

logger = logging.getLogger(__name__)

GONE = 410  # the watch's resourceVersion is older than the API server keeps: list again
WATCH_S = 60  # a watch request's timeout_seconds: then it is made again from the last version it saw
PAUSE_S = 5.0  # after a failed list or watch, before the next list


class Watch(Protocol):
    """What is used of `kubernetes.watch.Watch`: events of a list call made with watch=true, until its timeout."""

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]: ...
    def stop(self) -> None: ...


def _kube_watch() -> Watch:
    from kubernetes import watch

    return watch.Watch()  # type: ignore[no-untyped-call]


class PodWatch:
    """One thread per list it follows (each selector's pods, the exporter's EndpointSlices); `stop` ends them."""

    def __init__(self, selectors: Sequence[PodSelector], service: str, pods_api: Any, slices_api: Any,
                 on_change: Callable[[PodEndpoints], None], *, watch: Callable[[], Watch] = _kube_watch,
                 watch_s: int = WATCH_S, pause_s: float = PAUSE_S) -> None:
        self.selectors = list(selectors)
        self.service = service
        self.pods_api = pods_api
        self.slices_api = slices_api
        self.on_change = on_change
        self._watch = watch
        self.watch_s = watch_s
        self.pause_s = pause_s
        self.seen: PodEndpoints | None = None  # what was resolved last
        self._lock = threading.Lock()  # one resolution at a time
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[Watch] = []

    def start(self, found: PodEndpoints) -> None:
        """Follow from `found` (what the start resolved)."""
        self.seen = found
        ref = ServiceRef.parse(self.service)
        lists = [(f"pods {sel}", self.pods_api.list_namespaced_pod, sel.namespace, sel.selector)
                 for sel in self.selectors]
        slices = self.slices_api.list_namespaced_endpoint_slice
        lists.append((f"EndpointSlices of {ref.namespace}/{ref.service}", slices, ref.namespace,
                      f"{SERVICE_NAME_LABEL}={ref.service}"))
        for what, call, namespace, selector in lists:
            thread = threading.Thread(target=self._follow, args=(what, call, namespace, selector),
                                      name=f"watch {what}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float = 0.0) -> None:
        """No more resolutions (at once: the run's end does not wait for a watch's connection, its threads are
        daemons); `timeout_s` waits for the threads to end."""
        self._stopping.set()
        for watch in list(self._watches):
            watch.stop()
        for thread in self._threads if timeout_s > 0 else ():
            thread.join(timeout_s)

    def _follow(self, what: str, call: Callable[..., Any], namespace: str, selector: str) -> None:
        version: str | None = None
        said: str | None = None  # the failure last warned about (said again only when it changes)
        while not self._stopping.is_set():
            try:
                if version is None:  # (re)sync: what is there now, and the version to watch from
                    version = call(namespace, label_selector=selector).metadata.resource_version
                    self.resolve()
                version = self._watch_from(call, namespace, selector, version)
                said = None
            except Exception as exc:  # noqa: BLE001 - the client's errors are many (ApiException, urllib3's, OSError)
                if self._stopping.is_set():  # (`stop` shuts the watch's connection: that is no failure)
                    return
                if getattr(exc, "status", None) == GONE:
                    logger.info("%s: the watch's version is gone (410): listing again", what)
                else:
                    message = f"{what}: watching failed ({exc}); listing again every {self.pause_s:g} s"
                    logger.log(logging.WARNING if message != said else logging.DEBUG, "%s", message)
                    said = message
                    self._stopping.wait(self.pause_s)
                version = None

    def _watch_from(self, call: Callable[..., Any], namespace: str, selector: str, version: str) -> str:
        """One watch request, its events each a resolution; the last version it saw."""
        watch = self._watch()
        self._watches.append(watch)
        try:
            for event in watch.stream(call, namespace, label_selector=selector, resource_version=version,
                                      timeout_seconds=self.watch_s):
                if self._stopping.is_set():
                    break
                version = _version_of(event) or version
                self.resolve()
        finally:
            self._watches.remove(watch)
        return version

    def resolve(self) -> None:
        """The selection now; `on_change` when its pods or endpoints differ from the last one."""
        with self._lock:
            if self._stopping.is_set():
                return
            try:
                found = pod_endpoints(self.selectors, self.pods_api, self.slices_api, self.service)
            except DiscoveryError as exc:  # (a pod between two lives: no running pod for a moment)
                logger.warning("%s; the endpoints scraped so far stay", exc)
                return
            if self.seen is not None and (found.pods, found.urls) == (self.seen.pods, self.seen.urls):
                return
            self.seen = found
            self.on_change(found)


def _version_of(event: dict[str, Any]) -> str | None:
    obj = event.get("object")
    metadata = getattr(obj, "metadata", None)
    if metadata is None and isinstance(obj, dict):
        return (obj.get("metadata") or {}).get("resourceVersion")
    return getattr(metadata, "resource_version", None)
