"""The gateway inside the project: ASGI router, database-backed API keys, Django beside it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tenancy.services import api_key_create, api_key_revoke
from tests.factories import OrganizationFactory
from tests.support.models import DEMO, linear_reference
from tests.support.servers import serve_asgi

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def project_server(settings, tmp_path: Path) -> Iterator[str]:
    import shutil

    shutil.copytree(DEMO / "linear", tmp_path / "models" / "linear")
    settings.MODEL_REPOSITORY = tmp_path / "models"
    settings.API_KEY_CACHE_SECONDS = 0.0  # revocation takes effect at once in this test
    settings.SPOOL_DIR = tmp_path / "spool"
    settings.LEDGER_WRITER = "thread"  # the test database is visible to this process only
    from carbonledger.asgi import Router

    with serve_asgi(Router()) as address:
        yield address


def infer(address: str, key: str | None) -> requests.Response:
    x = np.ones((1, 256), dtype=np.float32)
    doc = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.ravel().tolist()}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(
        f"http://{address}/v2/models/linear/infer", data=json.dumps(doc), headers=headers, timeout=10
    )


def test_database_key_with_infer_scope_serves_and_names_its_organization(project_server: str) -> None:
    created = api_key_create(organization=OrganizationFactory(slug="acme"), scopes="infer")
    client = httpclient.InferenceServerClient(project_server)
    inp = httpclient.InferInput("x", [2, 256], "FP32")
    x = np.random.default_rng(5).standard_normal((2, 256), dtype=np.float32)
    inp.set_data_from_numpy(x)
    result = client.infer("linear", [inp], headers={"Authorization": f"Bearer {created.raw_key}"})
    np.testing.assert_allclose(result.as_numpy("y"), linear_reference(x), rtol=1e-5, atol=1e-5)
    client.close()


def test_revoked_key_is_refused_and_read_only_key_is_forbidden(project_server: str) -> None:
    org = OrganizationFactory()
    infer_key = api_key_create(organization=org, scopes="infer")
    read_key = api_key_create(organization=org, scopes="read")
    assert infer(project_server, infer_key.raw_key).status_code == 200
    api_key_revoke(api_key=infer_key.api_key)
    r = infer(project_server, infer_key.raw_key)
    assert r.status_code == 401 and r.json() == {"error": "invalid or revoked API key"}
    r = infer(project_server, read_key.raw_key)
    assert r.status_code == 403 and "'infer' scope" in r.json()["error"]
    assert infer(project_server, None).status_code == 401


def test_router_sends_other_paths_to_django(project_server: str) -> None:
    home = requests.get(f"http://{project_server}/", timeout=10)
    assert home.status_code == 200 and "CarbonLedger" in home.text
    assert requests.get(f"http://{project_server}/v2/health/ready", timeout=10).status_code == 200
    metrics = requests.get(f"http://{project_server}/metrics", timeout=10)
    assert 'nv_inference_count{model="linear",version="1"}' in metrics.text
