// Drives Debian's Chromium (headless) through hookd's dashboard, as an operator would.
// Run by tests/it/dashboard.rs against a host it seeded; every input comes from the
// environment:
//   HOOKD_URL            the admin listener, http://127.0.0.1:PORT
//   HOOKD_TOKEN          the admin token
//   HOOKD_SOURCE         the source of HOOKD_DEAD_EVENT
//   HOOKD_DEAD_EVENT     an event whose delivery to HOOKD_PLUGIN is dead, and succeeds if replayed
//   HOOKD_DISCARD_EVENT  another event of HOOKD_SOURCE whose delivery to HOOKD_PLUGIN is dead, in
//                        the same dead-letter group, to discard
//   HOOKD_PLUGIN         a plugin instance with a previous version
//   HOOKD_PREVIOUS_SHA   that previous version's sha256
//   HOOKD_CHROMIUM       the browser binary
//   HOOKD_PROFILE_DIR    a fresh, empty directory for the browser profile
//   HOOKD_SCREENSHOTS    where the screenshots go
// The quarantine holds two requests whose parser still traps: one is discarded, one stays.
// Exits non-zero, saying which step failed, on the first failure.
import { chromium } from "playwright-core";
import path from "node:path";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const base = env("HOOKD_URL");
const token = env("HOOKD_TOKEN");
const source = env("HOOKD_SOURCE");
const deadEvent = env("HOOKD_DEAD_EVENT");
const discardEvent = env("HOOKD_DISCARD_EVENT");
const plugin = env("HOOKD_PLUGIN");
const previousSha = env("HOOKD_PREVIOUS_SHA");
const shots = env("HOOKD_SCREENSHOTS");

let step = "launch";
const check = (condition, message) => {
  if (!condition) throw new Error(`${step}: ${message}`);
};
const log = (message) => console.log(`[dashboard] ${message}`);

const context = await chromium.launchPersistentContext(env("HOOKD_PROFILE_DIR"), {
  executablePath: env("HOOKD_CHROMIUM"),
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
  viewport: { width: 1280, height: 900 },
});
context.setDefaultTimeout(20_000);

const urls = [];
const problems = [];
context.on("request", (request) => urls.push(request.url()));
context.on("console", (message) => {
  // The refused sign-in's 401 and a refused state save's 400 are expected (and logged by
  // Chromium as failed loads).
  const text = message.text();
  const expected =
    /status of 401/.test(text) ||
    (/status of 400/.test(text) && /\/state\//.test(message.location().url ?? ""));
  if (message.type() === "error" && !expected) problems.push(`console: ${message.text()}`);
});
context.on("weberror", (error) => problems.push(`page error: ${error.error().message}`));

const page = context.pages()[0] ?? (await context.newPage());
// Confirmations (data-confirm) are accepted; what they asked is kept.
const dialogs = [];
page.on("dialog", (dialog) => {
  dialogs.push(dialog.message());
  dialog.accept();
});

/** Saves `name` at desktop width, then at a phone's, and back. */
async function screenshot(name) {
  await page.screenshot({ path: path.join(shots, `${name}-desktop.png`), fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: path.join(shots, `${name}-phone.png`), fullPage: true });
  await page.setViewportSize({ width: 1280, height: 900 });
}

/** Every element a keyboard reaches is labelled or has text (a screen reader can name it). */
async function checkLabels() {
  const unnamed = await page.evaluate(() =>
    [...document.querySelectorAll("a, button, input:not([type=hidden]), select")]
      .filter((el) => !el.hidden)
      .filter((el) => {
        const text = (el.innerText || "").trim();
        const label = el.getAttribute("aria-label") || el.getAttribute("title");
        const byLabel = el.labels && el.labels.length > 0;
        return !text && !label && !byLabel;
      })
      .map((el) => el.outerHTML.slice(0, 120)),
  );
  check(unnamed.length === 0, `controls without a name: ${unnamed.join(" | ")}`);
}

try {
  step = "a signed-out visit goes to the sign-in form";
  let response = await page.goto(base + "/");
  check(page.url() === base + "/sign-in", `landed on ${page.url()}`);
  const headers = response.headers();
  check(
    (headers["content-security-policy"] || "").includes("script-src 'self'"),
    `CSP: ${headers["content-security-policy"]}`,
  );
  check(headers["x-frame-options"] === "DENY", "X-Frame-Options");
  check(headers["referrer-policy"] === "same-origin", "Referrer-Policy");
  check(headers["cache-control"] === "no-store", "Cache-Control");

  step = "a wrong token is refused";
  await page.getByLabel("Admin token").fill("not-the-token");
  const [refused] = await Promise.all([
    page.waitForResponse((r) => r.url() === base + "/sign-in" && r.request().method() === "POST"),
    page.getByRole("button", { name: "Sign in" }).click(),
  ]);
  check(refused.status() === 401, `status ${refused.status()}`);
  await page.getByRole("alert").filter({ hasText: "not the admin token" }).waitFor();
  check((await context.cookies()).every((c) => c.name !== "hookd_session"), "no session cookie");
  await screenshot("sign-in-refused");

  step = "the right token signs in";
  await page.getByLabel("Admin token").fill(token);
  await Promise.all([page.waitForURL(base + "/"), page.getByRole("button", { name: "Sign in" }).click()]);
  const cookie = (await context.cookies()).find((c) => c.name === "hookd_session");
  check(cookie, "a session cookie");
  check(cookie.httpOnly, "the cookie is HttpOnly");
  check(cookie.sameSite === "Strict", `SameSite ${cookie.sameSite}`);
  check(cookie.path === "/", `Path ${cookie.path}`);
  await page.getByRole("heading", { name: "Overview" }).waitFor();
  await page.getByText(`${source}: requests per minute by outcome`).waitFor();
  check((await page.locator("svg.chart circle").count()) > 0, "the charts plot the requests");
  await checkLabels();
  await screenshot("overview");

  step = "the overview refreshes its live part";
  await page.locator("#refresh-status").filter({ hasText: "Updated" }).waitFor({ timeout: 25_000 });

  step = "a refresh leaves the keyboard focus where it is";
  const liveLink = page.locator("[data-refresh] a").first();
  await liveLink.focus();
  const focused = await liveLink.evaluate((a) => a.getAttribute("href"));
  await page.waitForTimeout(11_000);
  const still = await page.evaluate(() => document.activeElement && document.activeElement.getAttribute("href"));
  check(still === focused, `focus moved from ${focused} to ${still}`);

  step = "dead letters are grouped";
  await page.getByRole("link", { name: "Dead letters" }).first().click();
  await page.getByRole("heading", { name: "Dead letters" }).waitFor();
  const group = page.locator("tbody tr").filter({ hasText: plugin }).filter({ hasText: "permanent" });
  check((await group.locator("td.num").innerText()).trim() === "2", "the group counts 2");
  await group.getByRole("button", { name: `Replay the 2 permanent dead letters of ${plugin}` }).waitFor();
  await checkLabels();
  await screenshot("dead-letters");

  step = "a group's discard counts the group first, and Cancel discards nothing";
  await group.getByRole("button", { name: `Discard the 2 permanent dead letters of ${plugin}` }).click();
  await page.getByRole("heading", { name: "Discard?" }).waitFor();
  const groupNotice = await page.locator(".notice").innerText();
  check(groupNotice.includes("2 deliveries match"), `2 matches: ${groupNotice}`);
  check(groupNotice.includes("Discarding closes them as discarded"), `what it does: ${groupNotice}`);
  await page.getByRole("button", { name: "Discard 2" }).waitFor();
  await page.getByRole("link", { name: "Cancel" }).click();
  await page.getByRole("heading", { name: "Dead letters" }).waitFor();
  check((await group.locator("td.num").innerText()).trim() === "2", "still 2 after Cancel");

  step = "quarantine lists the held requests";
  await page.getByRole("link", { name: "Quarantine" }).click();
  await page.locator("tbody tr").first().waitFor();
  check((await page.locator("tbody tr").count()) === 2, "two held");
  check((await page.locator("tbody").innerText()).includes("trap"), "the reason names the trap");
  await checkLabels();
  await screenshot("quarantine");

  step = "replaying a request its parser still cannot parse says it stays held";
  await page.getByRole("button", { name: /^Replay request / }).first().click();
  const kept = page.getByRole("status").filter({ hasText: "still cannot be parsed and stays held" });
  await kept.waitFor();
  check((await kept.innerText()).includes("trap"), "the page gives the reason");
  await page.getByRole("link", { name: "Back to the quarantine" }).click();
  await page.locator("tbody tr").first().waitFor();

  step = "discard a held request: asked first, then gone from the list";
  const heldIds = await page.locator("tbody tr td.num").allInnerTexts();
  const [discardedId, keptId] = heldIds.map((id) => id.trim());
  await page.getByRole("button", { name: `Discard request ${discardedId}` }).click();
  await page.getByRole("status").filter({ hasText: "Discarded" }).waitFor();
  check(dialogs.some((d) => d.startsWith(`Discard request ${discardedId} `)), `asked: ${dialogs}`);
  await screenshot("quarantine-discarded");
  await page.getByRole("link", { name: "Back to the quarantine" }).click();
  await page.locator("tbody tr").first().waitFor();
  const left = (await page.locator("tbody tr td.num").allInnerTexts()).map((id) => id.trim());
  check(left.length === 1 && left[0] === keptId, `left held: ${left} (discarded ${discardedId})`);
  await page.getByText("1 held in all.").waitFor();

  step = "find an event by id";
  await page.getByRole("link", { name: "Events", exact: true }).click();
  await screenshot("events");
  await page.getByLabel("Event id").fill(deadEvent);
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL((url) => url.searchParams.get("q") === deadEvent);
  const rows = page.locator("tbody tr");
  check((await rows.count()) === 1, `one row, got ${await rows.count()}`);
  const isolated = await rows.first().evaluate((row) =>
    [...row.querySelectorAll("td, td a")].every((el) => getComputedStyle(el).unicodeBidi === "isolate"),
  );
  check(isolated, "the row's cells and links isolate their text (bidi controls stay inside)");
  await checkLabels();
  await screenshot("events-search");

  step = "open it";
  await rows.getByRole("link", { name: deadEvent }).click();
  await page.getByRole("heading", { name: `Event ${deadEvent}` }).waitFor();
  const delivery = page.getByRole("article", { name: `Delivery to ${plugin}` });
  check((await delivery.locator(".badge").first().innerText()) === "dead", "the delivery is dead");
  const body = await page.locator("#body").innerText();
  check(body.includes("<script>alert(1)</script>"), "the body is shown as text, escaped");
  check((await page.locator("script:not([src])").count()) === 0, "no inline script on the page");
  check(!(await page.locator("#body button, #body script").count()), "nothing of the body became markup");
  await checkLabels();
  await screenshot("event-detail");

  step = "replay the dead letter: the dry-run count first";
  await delivery.getByRole("button", { name: "Replay…" }).click();
  await page.getByRole("heading", { name: "Replay?" }).waitFor();
  check((await page.locator(".notice").innerText()).includes("1 delivery matches"), "1 match");
  await screenshot("replay-confirm");

  step = "confirm the replay and see it done";
  await page.getByRole("button", { name: "Replay 1" }).click();
  await page.getByRole("heading", { name: `Event ${deadEvent}` }).waitFor();
  const deadline = Date.now() + 30_000;
  for (;;) {
    const state = await page
      .getByRole("article", { name: `Delivery to ${plugin}` })
      .locator(".badge")
      .first()
      .innerText();
    if (state === "done") break;
    check(Date.now() < deadline, `still ${state} after 30 s`);
    await page.waitForTimeout(300);
    await page.reload();
  }
  await screenshot("event-replayed");

  step = "discard the other dead letter from its event page: the dry-run count first";
  await page.goto(`${base}/events/${source}/${discardEvent}`);
  const doomed = page.getByRole("article", { name: `Delivery to ${plugin}` });
  check((await doomed.locator(".badge").first().innerText()) === "dead", "the delivery is dead");
  await doomed.getByRole("button", { name: "Replay…" }).waitFor();
  await doomed.getByRole("button", { name: "Discard…" }).click();
  await page.getByRole("heading", { name: "Discard?" }).waitFor();
  const discardNotice = await page.locator(".notice").innerText();
  check(discardNotice.includes("1 delivery matches"), `1 match: ${discardNotice}`);
  check(discardNotice.includes("Discarding closes it as discarded"), `what it does: ${discardNotice}`);
  await checkLabels();
  await screenshot("discard-confirm");

  step = "confirm the discard and see it discarded";
  await page.getByRole("button", { name: "Discard 1" }).click();
  await page.getByRole("heading", { name: `Event ${discardEvent}` }).waitFor();
  const discarded = page.getByRole("article", { name: `Delivery to ${plugin}` });
  const discardedState = await discarded.locator(".badge").first().innerText();
  check(discardedState === "discarded", `the delivery is ${discardedState}`);
  check((await discarded.getByRole("button", { name: "Discard…" }).count()) === 0, "no discard of a discarded one");
  await screenshot("event-discarded");
  await page.getByRole("link", { name: "Dead letters" }).first().click();
  await page.getByText("No dead letters.").waitFor();

  step = "open the plugin's state and edit a key";
  await page.getByRole("link", { name: "Plugins" }).click();
  await page.getByRole("link", { name: `Keys of ${plugin}` }).click();
  await page.getByRole("link", { name: "count", exact: true }).click();
  const shownVersion = await page.locator("input[name=version]").first().inputValue();
  await page.getByLabel("Value", { exact: true }).fill("5");
  await screenshot("state-key");
  await page.getByRole("button", { name: "Save" }).click();
  await page.waitForURL(`${base}/plugins/${plugin}/state/count`);
  const saved = await page.getByLabel("Value", { exact: true }).inputValue();
  check(saved === "5", `value after saving: ${saved}`);
  const newVersion = await page.locator("input[name=version]").first().inputValue();
  check(newVersion !== shownVersion, `version still ${newVersion}`);

  step = "a save at a stale version is refused and says so";
  const csrf = await page.locator("input[name=csrf]").first().inputValue();
  const stale = await page.request.post(`${base}/plugins/${plugin}/state/count`, {
    form: { csrf, version: shownVersion, encoding: "json", value: "99" },
    maxRedirects: 0,
  });
  check(stale.status() === 409, `stale save: status ${stale.status()}`);
  check((await stale.text()).includes("Your edit was not saved"), "stale save: no message");

  step = "a value that is not JSON is refused, the typed text kept to mend";
  await page.getByLabel("Value", { exact: true }).fill("{\"total\": 5,");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByText("Your edit was not saved").waitFor();
  const unsaved = await page.getByLabel("Your unsaved text").inputValue();
  check(unsaved === "{\"total\": 5,", `unsaved text: ${unsaved}`);
  const unchanged = await page.getByLabel("Value", { exact: true }).inputValue();
  check(unchanged === "5", `value after a refused save: ${unchanged}`);

  step = "replaying a quarantined request that is not held says so";
  const notHeld = await page.request.post(`${base}/quarantine/999999999/replay`, {
    form: { csrf },
    maxRedirects: 0,
  });
  check(notHeld.status() === 404, `not held: status ${notHeld.status()}`);
  check((await notHeld.text()).includes("no quarantined request 999999999 is held"), "not held: no message");
  const discardedAgain = await page.request.post(`${base}/quarantine/${discardedId}/discard`, {
    form: { csrf },
    maxRedirects: 0,
  });
  check(discardedAgain.status() === 404, `discarded again: status ${discardedAgain.status()}`);

  step = "a POST without the CSRF token is refused";
  const noCsrf = await page.request.post(base + "/replay", {
    form: { handler: plugin, state: "done", confirm: "yes" },
    maxRedirects: 0,
  });
  check(noCsrf.status() === 403, `status ${noCsrf.status()}`);
  // The request still held stays held (this test's Rust side counts it).
  const noCsrfDiscard = await page.request.post(`${base}/quarantine/${keptId}/discard`, {
    form: {},
    maxRedirects: 0,
  });
  check(noCsrfDiscard.status() === 403, `discard without a token: status ${noCsrfDiscard.status()}`);
  const wrongCsrf = await page.request.post(`${base}/plugins/${plugin}/rollback`, {
    form: { csrf: "0".repeat(64) },
    maxRedirects: 0,
  });
  check(wrongCsrf.status() === 403, `wrong token: status ${wrongCsrf.status()}`);

  step = "a rollback confirmed for another version than the previous one is refused";
  const staleRollback = await page.request.post(`${base}/plugins/${plugin}/rollback`, {
    form: { csrf, expect: "0".repeat(64) },
    maxRedirects: 0,
  });
  check(staleRollback.status() === 409, `stale rollback: status ${staleRollback.status()}`);
  check((await staleRollback.text()).includes("nothing was rolled back"), "stale rollback: no message");

  step = "roll back a plugin";
  await page.getByRole("link", { name: "Plugins" }).click();
  const section = page.getByRole("region", { name: plugin, exact: true });
  const shortPrevious = previousSha.slice(0, 12);
  await checkLabels();
  await screenshot("plugins");
  await section.getByRole("button", { name: `Roll back to ${shortPrevious}` }).click();
  await page.waitForURL(base + "/plugins");
  const live = await page
    .getByRole("region", { name: plugin, exact: true })
    .locator("dd.sha")
    .first()
    .innerText();
  check(live.trim() === previousSha, `live sha after the rollback: ${live}`);
  await screenshot("plugins-rolled-back");

  step = "keyboard: the skip link is the first stop and leads to the content";
  await page.goto(base + "/events");
  await page.keyboard.press("Tab");
  check(
    (await page.evaluate(() => document.activeElement.textContent)) === "Skip to content",
    "first Tab stop",
  );

  step = "sign out";
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(base + "/sign-in");
  await page.goto(base + "/events");
  check(page.url() === base + "/sign-in", "signed out: the events page asks to sign in");

  step = "the token was never in a URL";
  check(urls.every((u) => !u.includes(token)), "a URL carried the token");
  check(problems.length === 0, problems.join("\n"));
  log(`all steps passed; screenshots in ${shots}`);
} catch (error) {
  console.error(error.stack || String(error));
  try {
    await page.screenshot({ path: path.join(shots, "failure.png"), fullPage: true });
    console.error(`page at failure: ${page.url()} (screenshot failure.png)`);
  } catch {}
  process.exitCode = 1;
} finally {
  await context.close();
}
