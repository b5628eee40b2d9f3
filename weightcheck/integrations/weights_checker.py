"""Interop with SGLang's own `/weights_checker` (what slime/miles `--check-weight-update-equal` drives).

SGLang's checker works on the engine's parameters: `snapshot` (host copy of every parameter), `reset_tensors`
(overwrite them with random values), `compare` (current vs snapshot, bitwise except block FP8) and
`checksum`. Frameworks that already run `snapshot → reset_tensors → update_weights → compare` at step 0 can
keep doing so and get weightcheck's localised report next to SGLang's verdict:

    from weightcheck.integrations.weights_checker import checked_weight_update

    with checked_weight_update("/shared/wc", against="/ckpt/Qwen3-8B", engines=["http://10.0.0.5:30000"]):
        update_weights()            # the framework's push; WEIGHTCHECK_DIR=/shared/wc in the engines

It snapshots and resets on entry, and on exit asks every engine to `compare`, verifies the tap's records of
the same sync, and raises `WeightSyncError` listing both (SGLang failures as WC737). Only the standard
library is used (urllib): no client dependency.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from weightcheck.findings import Finding, Severity
from weightcheck.rules.verify import ENGINE_CHECKER_FAILED, make_finding

ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")
_MESSAGE_LINES = 12


class WeightsCheckerError(RuntimeError):
    """The engine could not be asked (connection refused, not JSON...); the message says which and why."""


class WeightsCheckerClient:
    """One engine's `/weights_checker` endpoint (`POST {"action": ..., ...}`; 200 on success, 400 on failure)."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.last_reply: dict[str, Any] | None = None

    def call(self, action: str, **body: Any) -> dict[str, Any]:
        """POST one action; returns SGLang's reply (`success`, `message`, ...), whether it succeeded or not."""
        if action not in ACTIONS:
            raise ValueError(f"unknown /weights_checker action {action!r}; SGLang accepts {', '.join(ACTIONS)}")
        payload = json.dumps({"action": action, **body}).encode()
        request = urllib.request.Request(
            f"{self.base_url}/weights_checker", data=payload, headers={"Content-Type": "application/json"}
        )
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # 400: the action ran and failed; the body says why
            raw = exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise WeightsCheckerError(f"{self.base_url}/weights_checker ({action}): {exc}") from None
        try:
            reply = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            raise WeightsCheckerError(
                f"{self.base_url}/weights_checker ({action}) did not answer JSON: {raw[:200]!r}"
            ) from None
        if not isinstance(reply, dict):
            raise WeightsCheckerError(f"{self.base_url}/weights_checker ({action}): reply is not an object")
        self.last_reply = reply
        return reply

    def _require(self, action: str, **body: Any) -> dict[str, Any]:
        reply = self.call(action, **body)
        if not reply.get("success"):
            raise WeightsCheckerError(f"{self.base_url} {action} failed: {str(reply.get('message'))[:500]}")
        return reply

    def snapshot(self) -> dict[str, Any]:
        return self._require("snapshot")

    def reset_tensors(self) -> dict[str, Any]:
        return self._require("reset_tensors")

    def checksum(self) -> dict[str, Any]:
        return self._require("checksum")

    def compare(
        self, *, allow_quant_error: bool = False, skip_tensor_list: Sequence[str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"allow_quant_error": allow_quant_error}
        if skip_tensor_list:
            body["skip_tensor_list"] = list(skip_tensor_list)
        return self.call("compare", **body)

    def compare_findings(self, **kwargs: Any) -> list[Finding]:
        """Run `compare`; SGLang's failure (or an unreachable engine) as WC737 findings, none on success."""
        try:
            reply = self.compare(**kwargs)
        except WeightsCheckerError as exc:
            return [_finding(self.base_url, f"could not run /weights_checker compare: {exc}")]
        if reply.get("success"):
            return []
        lines = str(reply.get("message") or "").splitlines()
        excerpt = "\n".join(lines[:_MESSAGE_LINES]) + (
            f"\n… (+{len(lines) - _MESSAGE_LINES} lines)" if len(lines) > _MESSAGE_LINES else ""
        )
        return [_finding(self.base_url, f"SGLang /weights_checker compare failed:\n{excerpt}", reply)]


def _finding(url: str, message: str, reply: dict[str, Any] | None = None) -> Finding:
    # Built from the rule, fix text included: these findings join the result after verify ran, and the
    # report and the raised WeightSyncError must show WC737 with its fix.
    return make_finding(
        ENGINE_CHECKER_FAILED,
        message,
        file=url,
        severity=Severity.ERROR,
        details={"engine": url, "reply": reply} if reply is not None else {"engine": url},
    )


@contextlib.contextmanager
def checked_weight_update(
    records: str | os.PathLike[str],
    against: Any,
    *,
    engines: Sequence[str] = (),
    reset: bool = True,
    weight_version: str | None = None,
    allow_quant_error: bool = False,
    **verify_options: Any,
) -> Iterator[list[WeightsCheckerClient]]:
    """Wrap one weight push: SGLang snapshot (+ reset) before, SGLang compare + weightcheck verify after.

    Raises `weightcheck.verifying.WeightSyncError` when either finds a problem. Without `engines` it is
    `check_weight_update_equal` on exit.
    """
    from weightcheck.integrations.sync_check import check_weight_update_equal

    clients = [WeightsCheckerClient(url) for url in engines]
    for client in clients:
        client.snapshot()
        if reset:  # so that anything the push does not write differs from the snapshot
            client.reset_tensors()
    yield clients

    class _Compare:
        def __init__(self, client: WeightsCheckerClient) -> None:
            self.client = client

        def compare_findings(self) -> list[Finding]:
            return self.client.compare_findings(allow_quant_error=allow_quant_error)

    check_weight_update_equal(
        records,
        against,
        weight_version=weight_version,
        engine_checkers=[_Compare(c) for c in clients],
        **verify_options,
    )
