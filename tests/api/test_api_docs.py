"""/docs on the live server (which has an API key): behind the key (a browser is asked with
HTTP Basic), its HTML references only this server's own URLs, each of them loads, and a real
headless Chromium renders the operations with no request leaving the server."""

import base64
import re
import shutil
from urllib.parse import urlsplit

import httpx
import pytest

from tests.api.conftest import API_KEY, LiveServer

pytestmark = pytest.mark.timeout(90)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BASIC = "Basic " + base64.b64encode(f"me:{API_KEY}".encode()).decode()


def _references(html: str) -> list[str]:
    """Every URL the page loads: src/href attributes and the schema's `url:`."""
    found = re.findall(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""", html, flags=re.I)
    found += re.findall(r"""\burl:\s*['"]([^'"]+)['"]""", html)
    return found


def test_docs_need_the_key_and_load_only_local_assets(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as bare:
        for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui-bundle.js"):
            r = bare.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Basic ")  # a browser asks
            assert bare.get(path, headers={"X-API-Key": "wrong"}).status_code == 401
        assert bare.get("/docs", headers={"X-API-Key": API_KEY}).status_code == 200
        assert bare.get("/docs", headers={"Authorization": f"Bearer {API_KEY}"}).is_success
        page = bare.get("/docs", headers={"Authorization": BASIC})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        html = page.text
        assert "http://" not in html and "https://" not in html and "//cdn" not in html
        refs = _references(html)
        assert {"/openapi.json", "/docs/assets/swagger-ui-bundle.js",
                "/docs/assets/swagger-ui.css"} <= set(refs), refs
        kinds = {".js": "javascript", ".css": "text/css", ".json": "application/json",
                 ".png": "image/png"}
        for ref in refs:
            parts = urlsplit(ref)
            assert not parts.scheme and not parts.netloc and ref.startswith("/"), ref
            r = bare.get(ref, headers={"Authorization": BASIC})
            assert r.status_code == 200, ref
            want = next(v for k, v in kinds.items() if ref.endswith(k))
            assert want in r.headers["content-type"], (ref, r.headers["content-type"])
            assert len(r.content) > 1000, ref
        assert bare.get("/docs/assets/../settings.py",
                        headers={"Authorization": BASIC}).status_code == 404
        assert bare.get("/docs/assets/index.html",
                        headers={"Authorization": BASIC}).status_code == 404
        # The schema is the same document either way, and lists the /v1 operations.
        schema = bare.get("/openapi.json", headers={"X-API-Key": API_KEY}).json()
        assert "/v1/plans" in schema["paths"] and "/docs" not in schema["paths"]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup.sh installs it)")
def test_docs_render_in_headless_chromium_without_network(live: LiveServer) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    origin = live.url
    outside: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu"])
        try:
            context = browser.new_context(http_credentials={"username": "me",
                                                            "password": API_KEY})
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))

            def route(r: object) -> None:
                url = r.request.url  # type: ignore[attr-defined]
                if url.startswith((origin + "/", "data:", "blob:")):
                    r.continue_()  # type: ignore[attr-defined]
                else:  # the network: record and refuse
                    outside.append(url)
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.goto(origin + "/docs", wait_until="load")
            page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
            page.wait_for_selector("[data-path='/v1/plans']", timeout=30_000)
            title = page.inner_text(".swagger-ui .info .title")
        finally:
            browser.close()
    assert "DLRM sharding planner" in title
    assert outside == [], outside
    assert errors == [], errors
