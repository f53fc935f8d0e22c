"""The job file and the model it names, checked before a job is accepted. Framework-free: everything it needs
is an argument (the repository folder, the bounds), so the API, the services and the tests share it.

The job file is JSON Lines (UTF-8): one KServe v2 infer request body per line, exactly what one would POST to
``/v2/models/<model>/infer`` as JSON (no binary tensor extension). Blank lines are skipped; line numbers in
messages count every line of the file from 1. Each body is decoded with the gateway's own codec
(``inference.kserve.decode_request``) and checked against the model's ``config.pbtxt``
(``inference.kserve.validate_request``), so a request the gateway would refuse is refused at submission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inference.config import ConfigError, ModelSpec, load_config
from inference.errors import InvalidInput
from inference.kserve import decode_request, validate_request
from inference.limits import MODEL_NAME_MAX_LENGTH, MODEL_VERSION_MAX_LENGTH
from inference.repository import select_versions

# As wide as the job's columns (inference/limits.py); a version is also an int64 for the repository.
MODEL_NAME_PATTERN = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MODEL_NAME_MAX_LENGTH - 1}}}")
VERSION_PATTERN = re.compile(rf"[0-9]{{1,{min(18, MODEL_VERSION_MAX_LENGTH)}}}")


class JobInputError(ValueError):
    """A job that cannot be accepted; the message says what is wrong."""


@dataclass(frozen=True)
class JobLine:
    index: int  # order among the file's requests, from 0
    line: int  # line of the file, from 1
    body: bytes


def repository_models(repository: Path) -> list[str]:
    if not repository.is_dir():
        return []
    return sorted(p.name for p in repository.iterdir() if p.is_dir() and (p / "config.pbtxt").is_file())


def model_spec(repository: Path, model: str, version: str) -> ModelSpec:
    """The config of ``model`` in the model repository, and a check that ``version`` (when given) is one the
    gateway would serve. Raises :class:`JobInputError` naming what is wrong."""
    known = repository_models(repository)
    if not MODEL_NAME_PATTERN.fullmatch(model) or model not in known:
        listed = ", ".join(known) if known else "none"
        raise JobInputError(
            f"unknown model {model!r}: it is not in the model repository (models there: {listed})"
        )
    folder = repository / model
    try:
        spec = load_config(folder)
    except (ConfigError, ValueError) as exc:
        raise JobInputError(f"model {model!r} cannot be served: {exc}") from None
    available = [int(p.name) for p in folder.iterdir() if p.is_dir() and VERSION_PATTERN.fullmatch(p.name)]
    served = [str(v) for v in select_versions(spec, available)]
    if not served:
        raise JobInputError(f"model {model!r} has no version the gateway serves")
    if version and (not VERSION_PATTERN.fullmatch(version) or version not in served):
        raise JobInputError(
            f"model {model!r} has no version {version!r} (versions served: {', '.join(served)})"
        )
    return spec


def file_too_large(size: int, max_file_bytes: int) -> str | None:
    """Why a job file of ``size`` bytes is refused, or None when it fits (checked before reading an upload)."""
    if size > max_file_bytes:
        return f"the file is {size} bytes; at most {max_file_bytes} (JOBS_MAX_FILE_BYTES)"
    return None


def parse_job_file(
    data: bytes, spec: ModelSpec, *, max_requests: int, max_file_bytes: int, max_body_bytes: int
) -> list[JobLine]:
    """The requests of a job file, each decoded and validated against ``spec``; raises
    :class:`JobInputError` on the first problem, naming its line."""
    too_large = file_too_large(len(data), max_file_bytes)
    if too_large:
        raise JobInputError(too_large)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise JobInputError(f"line {line}: the file is not UTF-8 text (JSON Lines)") from None
    lines: list[JobLine] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        body = raw.strip()
        if not body:
            continue
        if len(lines) >= max_requests:
            raise JobInputError(f"the file holds more than {max_requests} requests (JOBS_MAX_REQUESTS)")
        if len(body) > max_body_bytes:
            raise JobInputError(
                f"line {number}: the request is {len(body)} bytes; the gateway takes at most "
                f"{max_body_bytes} (GATEWAY_MAX_BODY_BYTES)"
            )
        try:
            request = decode_request(body, None)
            validate_request(spec, request)
        except InvalidInput as exc:
            raise JobInputError(f"line {number}: {exc}") from None
        if request.binary_output_all or any(o.binary for o in request.outputs or ()):
            raise JobInputError(
                f"line {number}: binary outputs are not supported in a job (its outputs are kept as JSON)"
            )
        lines.append(JobLine(index=len(lines), line=number, body=body))
    if not lines:
        raise JobInputError("the file holds no request: JSON Lines, one KServe v2 infer request per line")
    return lines


def split_job_file(data: bytes) -> list[JobLine]:
    """The requests of a file already accepted by :func:`parse_job_file` (no checks again)."""
    lines: list[JobLine] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        body = raw.strip()
        if body:
            lines.append(JobLine(index=len(lines), line=number, body=body))
    return lines
