"""The pipeline's sinks for pods (issue 31): what leaves the sidecar live with `--gpu-pods`, and what the run's
report needs of the pods the pages name.

- `PodSelected`: before the pull page and OTLP, each page's selected GPUs only (bridge/select.py `select_pods`);
  an endpoint whose first page selects nothing is said at once, with the fix.
- `PodTimelineSink`: each GPU's pods as the pages name them, changes only (report/pods.py `Timelines`), so the
  report does not read the record log back for them.
- `SharedGpuNotes`: GPUs whose series name several pods at once (time-slicing, MPS) to the events file.

Each looks at a page's labels once per plan where it can: a page of the same plan as its endpoint's last one
has the same GPUs with the same labels in the same places.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.events import GpuShared
from bridge.pods import FIX, PodPattern, PodRef
from bridge.record_log import LineWriter
from bridge.select import Identity, select_pods, shared_gpus
from bridge.sidecar.pipeline import Page, PageSink, plan_of

if TYPE_CHECKING:  # report/pods.py (and the report's energy, windows) only where --gpu-pods is given (issue 48)
    from bridge.report.pods import GpuKey

logger = logging.getLogger(__name__)


class PodSelected:
    """`--gpu-pods` before the sinks whose data leaves the sidecar (the pull page, OTLP): each page's selected GPUs
    only (bridge/select.py `select_pods`). An endpoint whose first readable page selects nothing is said at once,
    with the fix: its GPUs carry no pod labels, or none is attributed to a matching pod."""

    def __init__(self, patterns: Sequence[PodPattern], sinks: Sequence[PageSink]) -> None:
        self.patterns = tuple(patterns)
        self.sinks = list(sinks)
        self.checked: set[str] = set()  # display keys whose first readable page was looked at

    def take(self, page: Page) -> None:
        chosen = select_pods(page.parsed, self.patterns)
        if page.display not in self.checked and chosen.gpus:
            self.checked.add(page.display)
            self._warn(page.display, chosen.labelled, chosen.selected)
        selected = page.with_parsed(chosen.page)
        for sink in self.sinks:
            sink.take(selected)

    def _warn(self, endpoint: str, labelled: int, selected: int) -> None:
        wanted = ", ".join(map(str, self.patterns))
        if not labelled:
            logger.warning("%s: no GPU carries pod labels (namespace/pod), so none can be matched to %s and none "
                           "is forwarded: %s", endpoint, wanted, FIX)
        elif not selected:
            logger.warning("%s: no GPU is attributed to a pod matching %s (yet), so none is forwarded; check the "
                           "pattern, and that %s", endpoint, wanted, FIX)


class PodTimelineSink:
    """`--gpu-pods`: each GPU's pods as the pages show them (report/pods.py `Timelines`), for the run's report, so
    the record log is not read back for them. A page of the same plan as its endpoint's last one names the same
    pods (the labels are the template's): they are read from its records once per plan."""

    def __init__(self) -> None:
        from bridge.report.pods import Timelines

        self.timelines = Timelines()
        self._pods: dict[str, tuple[int | None, dict[GpuKey, frozenset[PodRef | None]]]] = {}  # display -> plan

    def take(self, page: Page) -> None:
        plan = plan_of(page)
        known = self._pods.get(page.display)
        if plan is None or known is None or known[0] != plan:
            from bridge.report.pods import pods_of_records

            known = self._pods[page.display] = (plan, pods_of_records(page.display, page.records))
        for key, pods in known[1].items():
            self.timelines.add(key, page.start_ns, pods)


class SharedGpuNotes:
    """GPUs whose series on a page name several pods at once (bridge/select.py `shared_gpus`: time-slicing, MPS):
    a `gpu_shared` event when that changes, so the report (live and offline) lists such a board apart; said in
    the log when first seen. A page of the same plan as its endpoint's last one has the same labels: looked at
    once per plan."""

    def __init__(self, events: LineWriter) -> None:
        self.events = events
        self._plans: dict[str, tuple[int | None, dict[Identity, frozenset[PodRef]]]] = {}  # display -> plan's
        self._said: dict[tuple[str, Identity], frozenset[PodRef]] = {}  # (display, identity) -> pods written

    def take(self, page: Page) -> None:
        plan = plan_of(page)
        known = self._plans.get(page.display)
        if plan is None or known is None or known[0] != plan:
            known = self._plans[page.display] = (plan, shared_gpus(page.parsed))
        shared = known[1]
        for identity, pods in shared.items():
            if self._said.get((page.display, identity)) != pods:
                self._say(page, identity, pods)
        ended = [identity for (display, identity), pods in self._said.items()
                 if display == page.display and pods and identity not in shared]
        for identity in ended:  # shared no more
            self._say(page, identity, frozenset())

    def _say(self, page: Page, identity: Identity, pods: frozenset[PodRef]) -> None:
        names = tuple(sorted(map(str, pods)))
        if pods and (page.display, identity) not in self._said:
            logger.warning("%s: GPU %s serves %s at once (time-slicing or MPS): its energy is the whole board's, so "
                           "no pod's selection counts it", page.endpoint, identity[0], ", ".join(names))
        self._said[(page.display, identity)] = pods
        self.events.write_event(GpuShared(page.endpoint, page.start_ns, identity[0], identity[1], names))
