// hookd dashboard: progressive enhancement only. Every page works without this script; it adds
// the live refresh of the overview, the copy buttons, and a confirmation before a rollback, a
// state key's delete or a held request's discard (forms with data-confirm).
"use strict";

// Copy buttons: <button data-copy="ID" hidden> copies the text of element ID.
for (const button of document.querySelectorAll("button[data-copy]")) {
  button.hidden = false;
  button.addEventListener("click", async () => {
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const label = button.textContent;
    try {
      await navigator.clipboard.writeText(source.textContent);
      button.textContent = "Copied";
    } catch {
      // No clipboard access (plain http on another host): select the text instead.
      const range = document.createRange();
      range.selectNodeContents(source);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    }
    setTimeout(() => { button.textContent = label; }, 2000);
  });
}

// Live regions: <section data-refresh="/path" data-every="10"> is re-fetched and replaced.
for (const region of document.querySelectorAll("[data-refresh]")) {
  const every = Math.max(2, Number(region.dataset.every || 10)) * 1000;
  const status = document.getElementById("refresh-status");
  let shown = null;
  let failing = false;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const response = await fetch(region.dataset.refresh, { credentials: "same-origin" });
      if (response.redirected) { window.location.reload(); return; }
      if (!response.ok) throw new Error(String(response.status));
      const html = await response.text();
      // Replacing the region would drop the keyboard focus inside it: wait until it leaves.
      if (region.contains(document.activeElement)) return;
      // Only a change is announced (the status is a polite live region); times are UTC, as
      // everywhere on the dashboard.
      if (html === shown && !failing) return;
      failing = false;
      shown = html;
      region.innerHTML = html;
      if (status) status.textContent = "Updated " + new Date().toISOString().slice(11, 19) + " UTC";
    } catch (e) {
      failing = true;
      if (status) status.textContent = "Refresh failed (" + e.message + "); retrying";
    }
  }, every);
}

// Forms with data-confirm ask first.
for (const form of document.querySelectorAll("form[data-confirm]")) {
  form.addEventListener("submit", (event) => {
    if (!window.confirm(form.dataset.confirm)) event.preventDefault();
  });
}
