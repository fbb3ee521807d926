"""Screenshots of `toolgym view` on a run, for the README: overview, rollouts, one episode token by
token, and the compare view (the run's first and last evaluations), taken in Debian's headless
chromium (the test command installs it).

    python scripts/screenshots.py runs/demo docs/img

writes `viewer-overview.png`, `viewer-rollouts.png`, `viewer-episode.png` and
`viewer-compare.png` into the output directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolgym.viewer.app import serve

PAGES = ("overview", "rollouts", "episode", "compare")


def browser(width: int, height: int):
    """Headless chromium through its Debian driver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def take(run: Path, out: Path, width: int = 1400, height: int = 1000) -> list[Path]:
    """Serve `run`, open each page and save its screenshot under `out`; returns the files."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    out.mkdir(parents=True, exist_ok=True)
    server, url = serve([run])
    driver = browser(width, height)
    written = []
    try:
        for page in PAGES:
            if page == "episode":  # the first rollout listed on the rollouts page
                driver.get(url + "/rollouts")
                links = driver.find_elements(By.CSS_SELECTOR, "a.episode")
                if not links:
                    raise SystemExit(f"error: {run}: no rollouts yet; take the screenshots once a step has trained")
                link = links[0]
                link.click()
                WebDriverWait(driver, 30).until(expected_conditions.staleness_of(link))
            else:
                driver.get(url + ("/" if page == "overview" else f"/{page}"))
            path = out / f"viewer-{page}.png"
            driver.save_screenshot(str(path))
            written.append(path)
    finally:
        driver.quit()
        server.shutdown()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory (a campaign's out_dir)")
    parser.add_argument("out", type=Path, help="where the PNG files go")
    args = parser.parse_args()
    if not args.run.is_dir():
        print(f"error: {args.run}: no such directory", file=sys.stderr)
        return 2
    for path in take(args.run, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
