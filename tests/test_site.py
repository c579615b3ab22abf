"""The rendered course (tools/build_site.py), built into a temporary folder, served on
localhost and read in a real headless browser (Debian's chromium, driven by Playwright):
every lesson page renders, its plots load, next/previous links walk the lessons in order,
no page logs a console error or asks for anything off this machine.

The browser tests need /usr/bin/chromium (Debian: ``apt-get install -y chromium``): without
it they are skipped, saying so, unless ``GEMM_LESSONS_REQUIRE_BROWSER=1`` (CI) makes that a
failure; ``GEMM_LESSONS_SKIP_BROWSER=1`` skips them (the build checks still run)."""
import functools
import http.server
import json
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_site  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted(p.stem for p in (ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "html"
    build_site.build(out)
    return out


# ------------------------------------------------------------------ the build, no browser
def test_staging_adds_instructors_when_present_and_drops_the_colab_cell(tmp_path):
    import colab
    root = tmp_path / "repo"
    for part in ("docs", "notebooks", "solutions", "exercises", "gemm_lessons/results"):
        shutil.copytree(ROOT / part, root / part)
    shutil.copy2(ROOT / "README.md", root / "README.md")
    assert colab.main(["--root", str(root)]) == 0
    for present in (False, True):
        if present:
            (root / "docs" / "instructors.md").write_text("# For instructors\n")
        else:
            (root / "docs" / "instructors.md").unlink(missing_ok=True)
        src = tmp_path / f"src{present}"
        src.mkdir()
        build_site.stage(src, root)
        index = (src / "index.md").read_text()
        assert "%INSTRUCTORS%" not in index
        assert ("\ninstructors\n" in index) == present
        assert (src / "instructors.md").exists() == present
        for folder, stems in (("notebooks", LESSONS), ("exercises", EXERCISES)):
            staged = sorted((src / folder).glob("*.ipynb"))
            assert [p.stem for p in staged] == stems
            for p in staged:
                nb, orig = json.loads(p.read_text()), json.loads((root / folder / p.name).read_text())
                assert not [c for c in nb["cells"] if c.get("id") == colab.CELL_ID], p
                assert len(nb["cells"]) == len(orig["cells"]) - 1, "only the setup cell goes"


def test_every_lesson_exercise_and_the_results_have_a_page(site):
    for stem in LESSONS:
        assert (site / "notebooks" / f"{stem}.html").exists(), stem
    for stem in EXERCISES:
        assert (site / "exercises" / f"{stem}.html").exists(), stem
    results = (site / "results.html").read_text()
    assert "h200_ladder.png" in results
    # the table is the CSV's: one row per recorded measurement
    rows = (ROOT / "gemm_lessons" / "results" / "h200_ladder.csv").read_text().strip().splitlines()
    assert results.count("<tr") == len(rows), "a header row and one row per CSV line"
    index = (site / "index.html").read_text()
    for stem in LESSONS:
        assert f'href="notebooks/{stem}.html' in index, f"the home page links {stem}"


def test_the_pages_fetch_nothing_from_outside(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= len(LESSONS) + len(EXERCISES) + 2
    remote = re.compile(r"<(script|link|img|iframe|source|video|audio)\b[^>]*"
                        r"\b(src|href)=[\"']?(https?:)?//", re.I)
    for page in pages:
        html = page.read_text()
        for m in remote.finditer(html):
            tag = m.group(0)
            if tag.lower().startswith("<link") and not re.search(
                    r"rel=[\"']?(stylesheet|preload|modulepreload|icon|manifest)", tag, re.I):
                continue            # rel="next"/"prev"/"index"… are links, not loads
            pytest.fail(f"{page.relative_to(site)} loads a remote resource: {tag[:200]}")
    assert (site / "_static" / "mathjax" / "MathJax.js").exists(), "MathJax is served locally"
    lesson = (site / "notebooks" / f"{LESSONS[0]}.html").read_text()
    assert "_static/mathjax/MathJax.js" in lesson


# ------------------------------------------------------------------ in a browser
@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    if os.environ.get("GEMM_LESSONS_SKIP_BROWSER") == "1":
        pytest.skip("GEMM_LESSONS_SKIP_BROWSER=1")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        why = (f"{CHROMIUM} not found: the site's browser test needs Debian's chromium "
               "(apt-get install -y chromium)")
        if os.environ.get("GEMM_LESSONS_REQUIRE_BROWSER") == "1":     # CI: .ci/run sets it
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed (it is in the dev extra: pip install -e '.[dev]')",
                    pytrace=False)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900})
        context.set_default_timeout(30_000)
        problems = []
        page = context.pages[0] if context.pages else context.new_page()

        def on_console(msg):
            if msg.type == "error":
                problems.append(f"console error on {page.url}: {msg.text}")

        def on_request(route):
            host = urlparse(route.request.url).hostname
            if route.request.url.startswith(("data:", "blob:", "about:")) or host == "127.0.0.1":
                return route.continue_()
            problems.append(f"{page.url} asked for {route.request.url}")
            return route.abort()

        page.on("console", on_console)
        page.on("pageerror", lambda err: problems.append(f"script error on {page.url}: {err}"))
        context.route("**/*", on_request)
        yield page, base, problems
        context.close()
    server.shutdown()
    thread.join(timeout=10)


IMAGES_LOADED = """async () => {
    const imgs = Array.from(document.images);
    for (const img of imgs) img.loading = "eager";
    await Promise.all(imgs.map(img => img.complete ? null : new Promise(ok => {
        img.addEventListener("load", ok); img.addEventListener("error", ok);
    })));
    return imgs.map(img => [img.getAttribute("src"), img.naturalWidth]);
}"""


def _check_page(page, path, title_pattern):
    assert urlparse(page.url).path.endswith(path), f"expected {path}, at {page.url}"
    page.wait_for_load_state("networkidle")
    h1 = page.locator("h1").first
    assert h1.is_visible(), f"{path}: no visible title"
    assert re.search(title_pattern, h1.inner_text()), f"{path}: title {h1.inner_text()!r}"
    assert re.search(title_pattern, page.title()), f"{path}: page title {page.title()!r}"
    images = page.evaluate(IMAGES_LOADED)
    broken = [src for src, width in images if not width]
    assert not broken, f"{path}: images that did not load: {broken}"
    return images


def _follow(page, which):
    link = page.locator(f"a.{which}-page").first
    assert link.count(), f"{page.url}: no {which} link"
    with page.expect_navigation():
        link.click()


def test_lessons_render_and_next_previous_walk_them_in_order(browser):
    page, base, problems = browser
    page.goto(base + "index.html")
    page.wait_for_load_state("networkidle")
    _follow(page, "next")
    plots = 0
    for i, stem in enumerate(LESSONS):
        n = stem[:2]
        images = _check_page(page, f"/notebooks/{stem}.html", rf"^Lesson {n}\b")
        plots += len(images)
        if i + 1 < len(LESSONS):
            _follow(page, "next")
    assert plots >= len(LESSONS) // 2, "the lessons' stored plots are on their pages"
    for stem in reversed(LESSONS[:-1]):
        _follow(page, "prev")
        assert urlparse(page.url).path.endswith(f"/notebooks/{stem}.html"), page.url
        assert page.locator("h1").first.inner_text().startswith(f"Lesson {stem[:2]}")
    _follow(page, "prev")
    assert urlparse(page.url).path.endswith("/index.html") or urlparse(page.url).path == "/"
    assert not problems, "\n".join(problems)


def test_exercises_and_results_render(browser):
    page, base, problems = browser
    for stem in EXERCISES:
        page.goto(base + f"exercises/{stem}.html")
        _check_page(page, f"/exercises/{stem}.html", rf"\b{stem[:2]}\b")
    page.goto(base + "results.html")
    images = _check_page(page, "/results.html", r"^Results")
    assert any("h200_ladder" in src for src, _ in images), "the ladder plot is on the page"
    assert page.locator("table tr").count() >= 2
    assert not problems, "\n".join(problems)


def test_math_is_typeset(browser):
    page, base, problems = browser
    page.goto(base + f"notebooks/{LESSONS[0]}.html")
    page.wait_for_load_state("networkidle")
    if not page.locator("span.math").count():
        pytest.skip("no math on this page")
    page.wait_for_function("() => document.querySelectorAll('.MathJax').length > 0")
    assert not problems, "\n".join(problems)
