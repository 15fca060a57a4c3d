"""The selection stage, after normalisation: which endpoints' GPU records go on to the sinks and the report.

    normalised records ─▶ relabel (per series, where series leave: relabel.py) ─▶ de-duplication ─▶ pod selection

De-duplication (issue 27: one GPU, one count). A GPU's identity is its UUID plus its MIG instance
(normalize.py); an identity without a UUID (`unknown:…`) identifies nothing and is left out. Two endpoints
(of any kind of source: an exporter's URL, a local reader such as `pynvml://localhost`) that serve the
same GPUs are one source:

- an endpoint whose GPUs are all served by another is its duplicate: the endpoint serving more GPUs is
  kept; between two serving the same GPUs, the one earlier in the preference order (`preference_order`:
  the URLs the user gave, in the user's order, before the built-in defaults);
- endpoints that share only some GPUs are both kept (neither is the other's duplicate);
- a duplicate is not scraped any more, not recorded and not forwarded (the live pipeline), and its
  records, if any were written before the decision, are left out of the report (`select_series`, the
  same rule over the same identities, live and offline).

Compat mode (`--counter-mode aiperf`) de-duplicates too: the one deliberate difference from AIPerf, which
sums a GPU once per endpoint that serves it.

Pod selection (issue 31, `--gpu-pods`; bridge/pods.py decides per label set). What leaves the sidecar live
(OTLP, the pull /metrics page) is the series of the GPUs a page attributes to matching pods (`select_pods`);
the record log keeps every GPU with its pod labels, and the report applies the same rule per sample
(report/pods.py). A GPU is selected on a page when one of its series names a matching pod and its board (its
UUID) names no other pod on that page (`pods.shared_board`: such a board is reported apart, never forwarded
as the benchmark's).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

from bridge.endpoints import display_key
from bridge.parse import AnyPage, TemplatedPage
from bridge.pods import PodPattern, PodRef, pod_of_labels, serves, shared_board
from bridge.samples import ParsedPage

Identity = tuple[str, str | None]  # (GPU UUID, MIG instance or None)
UNKNOWN_PREFIX = "unknown:"  # normalize.py's identity for a GPU without a UUID


def preference_order(user: Sequence[str], defaults: Sequence[str]) -> list[str]:
    """The endpoints in the order de-duplication prefers them: the user's, in order, then the defaults."""
    return list(dict.fromkeys([*user, *defaults]))


def known(identities: Iterable[Identity]) -> frozenset[Identity]:
    """The identities that identify a GPU (those with a UUID)."""
    return frozenset(i for i in identities if not i[0].startswith(UNKNOWN_PREFIX))


def duplicates_of(served: Mapping[str, Collection[Identity]], preference: Sequence[str]) -> dict[str, str]:
    """dropped endpoint → the endpoint it duplicates, for endpoints keyed by display key (host:port) as in
    `served` (each endpoint's GPU identities over the run). `preference` may hold URLs or display keys;
    an endpoint not in it comes after those that are, in `served`'s order."""
    rank = {_key(e): n for n, e in enumerate(preference)}
    gpus = {endpoint: known(ids) for endpoint, ids in served.items()}
    order = sorted(gpus, key=lambda e: (-len(gpus[e]), rank.get(e, len(rank))))  # (sorted is stable)
    kept: list[str] = []
    out: dict[str, str] = {}
    for endpoint in order:
        mine = gpus[endpoint]
        twin = next((k for k in kept if mine and mine <= gpus[k]), None)
        if twin is None:
            kept.append(endpoint)
        else:
            out[endpoint] = twin
    return out


def _key(endpoint: str) -> str:
    """An endpoint's display key, from its URL or its display key."""
    return display_key(endpoint) if "://" in endpoint else endpoint


def describe(dropped: str, kept: str) -> str:
    """The one line that says a duplicate was dropped (the log, the events file, the report's summary)."""
    return f"{dropped} serves the same GPUs as {kept}: dropped as its duplicate, {kept} is kept (one GPU, one count)"


class Deduplicator:
    """The live side of the rule: each endpoint's identities as its pages show them, and which endpoints are
    duplicates now. `observe` costs a set lookup for a page whose GPUs were all seen before on its endpoint."""

    def __init__(self, preference: Sequence[str]) -> None:
        self.preference = list(preference)
        self.served: dict[str, set[Identity]] = {}  # display key -> identities seen
        self.dropped: dict[str, str] = {}  # display key -> the endpoint it duplicates

    def observe(self, endpoint: str, identities: Iterable[Identity]) -> dict[str, str]:
        """An endpoint's page's identities; the endpoints newly found duplicates (dropped → kept), often none."""
        seen = self.served.setdefault(endpoint, set())
        before = len(seen)
        seen.update(identities)
        if len(seen) == before:
            return {}
        now = duplicates_of(self.served, self.preference)
        new = {d: k for d, k in now.items() if d not in self.dropped}
        self.dropped.update(new)  # (once dropped, an endpoint is not scraped again: it stays dropped)
        return new


class _HasEndpoint(Protocol):
    @property
    def endpoint(self) -> str: ...

    @property
    def meta(self) -> _HasIdentity: ...


class _HasIdentity(Protocol):
    @property
    def identity(self) -> Identity: ...


S = TypeVar("S", bound=_HasEndpoint)


def select_series(series: Sequence[S], preference: Sequence[str],
                  dropped: Mapping[str, str] | None = None) -> tuple[list[S], dict[str, str]]:
    """The report's series without those of duplicate endpoints, and which were dropped (→ kept): the rule over
    the series' identities, plus `dropped` (what the live run decided, from its events file)."""
    out = {_key(d): k for d, k in (dropped or {}).items()}
    served: dict[str, set[Identity]] = {}
    for s in series:
        if s.endpoint not in out:  # (what the run decided stands; the rule decides among the others)
            served.setdefault(s.endpoint, set()).add(s.meta.identity)
    out.update(duplicates_of(served, preference))
    return [s for s in series if s.endpoint not in out], out


_DUPLICATE_OF = "duplicate of "


def duplicate_reason(kept: str) -> str:
    """The `endpoint_state` event's reason for a dropped duplicate (read back by `kept_of`)."""
    return _DUPLICATE_OF + kept


def kept_of(reason: str) -> str | None:
    return reason[len(_DUPLICATE_OF):] if reason.startswith(_DUPLICATE_OF) else None


class PodPage(NamedTuple):
    """A page after pod selection: its selected GPUs' series, and what the page says about its GPUs' pods."""

    page: ParsedPage  # the series of the selected GPUs only
    gpus: int  # GPU identities on the page
    labelled: int  # of them, those a pod label names
    selected: int  # of them, those selected


def _gpu_of_labels(labels: Mapping[str, str]) -> Identity | None:
    """A series' GPU identity as normalize.py keys it (`UUID`, or `uuid` under `-o`, plus `GPU_I_ID`)."""
    uuid = labels.get("UUID") or labels.get("uuid")
    return (uuid, labels.get("GPU_I_ID") or None) if uuid else None


def _pods_by_gpu(page: AnyPage) -> dict[Identity, set[PodRef | None]]:
    """The pods each GPU identity's series on `page` name (None for a series that names none)."""
    pods: dict[Identity, set[PodRef | None]] = {}
    # (A templated page's labels are its template's: no Sample tuples are built for a page that needs none.)
    every = page.template.labels if isinstance(page, TemplatedPage) else [sample.labels for sample in page.samples]
    for labels in every:
        gpu = _gpu_of_labels(labels)
        if gpu is not None:
            pods.setdefault(gpu, set()).add(pod_of_labels(labels))
    return pods


def shared_gpus(page: AnyPage) -> dict[Identity, frozenset[PodRef]]:
    """The GPUs whose series on `page` name several pods at once: time-slicing or MPS, as dcgm-exporter shows
    them with KUBERNETES_VIRTUAL_GPUS (the GPU's series once per pod, a `vgpu` label apart). The record log keeps
    one pod per GPU and scrape, so this goes to the events file (`gpu_shared`) for the report."""
    out: dict[Identity, frozenset[PodRef]] = {}
    for gpu, refs in _pods_by_gpu(page).items():
        named = frozenset(r for r in refs if r is not None)
        if len(named) > 1:
            out[gpu] = named
    return out


def select_pods(page: AnyPage, patterns: Sequence[PodPattern]) -> PodPage:
    """The series of the GPUs `page` attributes to pods matching `patterns` (see the module docstring); a series
    that names no GPU (no UUID) serves no pod and is left out too."""
    pods = _pods_by_gpu(page)
    boards: dict[str, set[PodRef | None]] = {}
    for (uuid, _instance), refs in pods.items():
        boards.setdefault(uuid, set()).update(refs)
    chosen = {gpu for gpu, refs in pods.items()
              if any(serves(patterns, r) for r in refs) and not shared_board(patterns, boards[gpu[0]])}
    samples = [s for s in page.samples if _gpu_of_labels(s.labels) in chosen]
    labelled = sum(1 for refs in pods.values() if refs != {None})
    return PodPage(ParsedPage(samples, page.types, page.helps, []), len(pods), labelled, len(chosen))
