"""`toolgym view`: the web app driven in a real headless browser (Debian's chromium) over a run
made by a short campaign: overview, filters, one episode token by token, the compare view; a
screenshot of each page lands in the test's temporary directory."""

from __future__ import annotations

import json

import pytest
import yaml

from toolgym.viewer.app import serve


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A short campaign on the tiny model: SFT, two RL steps, base/SFT/final evaluations."""
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import load_config

    root = tmp_path_factory.mktemp("viewer")
    config = {
        "name": "viewed",
        "seed": 3,
        "out_dir": str(root / "run"),
        "model": {"init": "tiny"},
        "envs": [{"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 20, "eval_tasks": 6}],
        "sft": {"steps": 2, "batch_size": 4, "demos_per_suite": 8},
        "rl": {"steps": 2, "tasks_per_step": 3, "group_size": 2, "learner": {"lr": 1e-3, "token_budget": 4096}},
        "sampler": {"min_attempts": 2},
        "eval": {"base_tasks": 6},
        "rollout": {"max_turns": 3, "max_new_tokens": 16, "concurrency": 8},
        "checkpoint": {"every": 2, "keep": 1},
    }
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(config))
    campaign = Campaign(load_config(path), progress=False)
    try:
        campaign.run()
    finally:
        campaign.close()
    return root / "run"


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def _click_and_wait_for_the_next_page(browser, element):
    """Click a link or submit button and wait until the old page is gone: reading the page at
    once could read the old one, whose elements then turn stale mid-read."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    element.click()
    WebDriverWait(browser, 30).until(expected_conditions.staleness_of(element))


def test_the_viewer_in_a_real_browser(run_dir, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    server, url = serve([run_dir])
    try:
        browser.get(url + "/")
        assert "records" in browser.find_element(By.ID, "evals").text and "base" in browser.page_source
        assert browser.find_elements(By.CSS_SELECTOR, "img.plot")
        browser.save_screenshot(str(tmp_path / "overview.png"))

        browser.get(url + "/rollouts")  # the latest step by default
        last = sorted((run_dir / "rollouts").glob("step-*.jsonl"))[-1]
        rows = [json.loads(line) for line in last.read_text().splitlines()]
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.row")) == len(rows) > 0
        Select(browser.find_element(By.NAME, "family")).select_by_index(1)  # the first family present
        _click_and_wait_for_the_next_page(browser, browser.find_element(By.ID, "apply"))
        picked = browser.find_element(By.NAME, "family").get_attribute("value")
        cells = [r.find_elements(By.TAG_NAME, "td")[3].text for r in browser.find_elements(By.CSS_SELECTOR, "tr.row")]
        assert cells and set(cells) == {picked} and len(cells) == sum(r["family"] == picked for r in rows)
        browser.get(url + "/rollouts?min_reward=0.5")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.row")) == sum(r["reward"] >= 0.5 for r in rows)
        browser.get(url + "/rollouts?sort=length")
        lengths = [int(r.find_elements(By.TAG_NAME, "td")[6].text) for r in browser.find_elements(By.CSS_SELECTOR, "tr.row")]
        assert lengths == sorted(lengths, reverse=True)
        browser.get(url + "/rollouts?audit=1")
        assert {r.find_elements(By.TAG_NAME, "td")[0].text for r in browser.find_elements(By.CSS_SELECTOR, "tr.row")} == {
            "top reward",
            "random",
        }
        browser.save_screenshot(str(tmp_path / "rollouts.png"))

        _click_and_wait_for_the_next_page(browser, browser.find_elements(By.CSS_SELECTOR, "a.episode")[0])
        source = browser.current_url.split("source=")[1].split("&")[0]
        index = int(browser.current_url.split("i=")[1].split("&")[0])
        traj = json.loads((run_dir / source).read_text().splitlines()[index])
        mask = [1 if s["kind"] == "policy" else 0 for s in traj["segments"] for _ in s["token_ids"]]
        spans = browser.find_elements(By.CSS_SELECTOR, "#tokens span.tok")
        shown = [int(s.get_attribute("data-mask")) for s in spans for _ in range(int(s.get_attribute("data-tokens")))]
        assert shown == mask  # the coloured policy spans are exactly the loss mask
        policy = [s for s in spans if "policy" in s.get_attribute("class")]
        assert policy and all(s.get_attribute("data-mask") == "1" for s in policy)
        assert "id " in policy[0].get_attribute("title") and "logp" in policy[0].get_attribute("title")
        assert browser.find_element(By.ID, "outcome").text == traj["outcome"]
        browser.save_screenshot(str(tmp_path / "episode.png"))

        browser.get(url + "/compare")
        assert "tasks in both" in browser.find_element(By.ID, "summary").text
        # by default the model before training against the trained one (the campaign's order, not the alphabet's)
        picked = [Select(browser.find_element(By.NAME, side)).first_selected_option.get_attribute("value") for side in ("a", "b")]
        assert picked == [f"run:eval/{label}/records/trajectories.jsonl" for label in ("base", "final")]
        browser.save_screenshot(str(tmp_path / "compare.png"))

        browser.get(url + "/episode?source=rollouts/nothing.jsonl&i=0")
        assert "not a trajectory file of this run" in browser.find_element(By.ID, "error").text
    finally:
        server.shutdown()
    for page in ("overview", "rollouts", "episode", "compare"):
        assert (tmp_path / f"{page}.png").stat().st_size > 5000


def test_a_half_written_run_is_a_clear_page(tmp_path, browser):
    from selenium.webdriver.common.by import By

    run = tmp_path / "partial"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "tra')
    (run / "rollouts" / "step-0001.jsonl").write_text('{"task_id": "t1", "outcome": "passed", "reward": 1.0}\n{"task_')
    server, url = serve([run])
    try:
        browser.get(url + "/")
        assert "No evaluation written yet" in browser.page_source and "no config.yaml" in browser.page_source
        browser.get(url + "/rollouts")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.row")) == 1  # the half line is skipped
        browser.get(url + "/episode?source=rollouts/step-0001.jsonl&i=1")
        assert "still being written" in browser.find_element(By.ID, "error").text
    finally:
        server.shutdown()
    from conftest import run_cli

    res = run_cli("view", str(tmp_path / "not-a-run"))
    assert res.returncode == 2 and res.stderr.strip() == f"error: {tmp_path / 'not-a-run'}: no such directory"
