"""The one exception tree. The CLI catches `BridgeError` once and prints its message as one line.

    BridgeError
    ├── ConfigError            bad configuration: start-up stops (exit 2)       config.py
    │   ├── TelemetryItemError     a --gpu-telemetry item of no accepted form      endpoints.py
    │   ├── CustomMetricsError     a custom-metrics CSV line                      fields.py
    │   ├── RelabelConfigError     a relabel rules file                           relabel.py
    │   ├── OtlpConfigError        OTLP settings                                  otlp/config.py
    │   └── ReportInputError       a report input with no usable record in the window  report/cli.py
    ├── FetchError             one page could not be fetched (its `kind`)          fetch.py
    ├── RecordLogError         the record log could not be written               record_log.py
    ├── ReportError            the report could not be built or written
    │   ├── WindowError            no usable window from the marks/manifest      report/window.py
    │   └── ReportWriteError       a report file could not be written            report/write.py
    ├── LifecycleError         a control request with a bad value (a 400)         sidecar/marks.py
    │   └── SequenceError          one that does not fit the run's state (a 409)  sidecar/marks.py
    └── KubeError              the Kubernetes API refused or failed               kube/submit.py
        ├── DiscoveryError         a k8s:// item that cannot be expanded          discovery.py
        └── ValidationError        inputs that would make an invalid JobSet       kube/validate.py

Each error keeps the built-in base its callers already catch (ValueError for bad input, OSError for
files), so `except ValueError` stays true; lower-layer errors are translated where they cross into the
bridge (`raise FetchError(...) from exc`). A bad exposition line is not an error: the parser drops and
counts it (parse.LabelError never leaves the parser).
"""

from __future__ import annotations

from bridge.samples import FetchErrorKind


class BridgeError(Exception):
    """Every error the bridge raises on purpose: its message is for the user, one line, no traceback."""


class ConfigError(BridgeError, ValueError):
    """Bad configuration: start-up stops with this message."""


class ReportInputError(ConfigError):
    """`dcgm-bridge report` was given inputs that hold no usable record in the window: nothing is written."""


class FetchError(BridgeError):
    """One page could not be fetched; `kind` is the events file's fetch-error kind."""

    def __init__(self, kind: FetchErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: FetchErrorKind = kind
        self.message = message


class RecordLogError(BridgeError, OSError):
    """The record log could not be written (disk full, permission): nothing already flushed is lost."""


class ReportError(BridgeError):
    """The report could not be built or written."""


class LifecycleError(BridgeError, ValueError):
    """A control request with a bad value (a 400 for the control API)."""


class SequenceError(LifecycleError):
    """A control request that does not fit the run's state: a phase mark out of sequence, a mark after
    completion (a 409 for the control API)."""


class KubeError(BridgeError, RuntimeError):
    """The Kubernetes API refused or failed; `exit_code` for the CLI, `status` the HTTP status behind it."""

    def __init__(self, message: str, exit_code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status
