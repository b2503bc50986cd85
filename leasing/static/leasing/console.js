/* Live refresh of the leasing console without reloading the page.
 *
 * An element with data-leasing-refresh="N" (seconds) refreshes every N s: the
 * page's own URL is fetched with the header X-Leasing-Fragment (the dashboard
 * then answers with its panels only), and each [data-leasing-panel] of this
 * page is replaced by the one of the same name in the answer. Opened <details
 * data-key> stay open. Nothing is fetched while the tab is hidden (one refresh
 * runs when it is shown again), nor while rows of a list are ticked for an
 * action, so a selection is never lost. A list's rows are re-bound to Django's
 * action checkboxes after each swap.
 *
 * While the tab is hidden (document.visibilityState) no timer runs at all: the
 * refresh stops, and starts again with one refresh at once when the tab is
 * shown. data-leasing-refresh-state on <html> says which ("live", "paused").
 *
 * An answer with none of this page's panels swaps nothing and never counts as
 * "updated". When the admin session ended, the fetch follows the redirect to
 * the login page, which answers 200: the stamp then says the session ended and
 * how old the figures are (state "signed-out"). The timer goes on, so signing
 * in again in another tab makes the page live again. Any other such answer, or
 * an HTTP error, is "refresh failed".
 */
"use strict";
(function () {
    const root = document.querySelector("[data-leasing-refresh]");
    const seconds = root ? Number(root.dataset.leasingRefresh) : 0;
    if (!root || !(seconds > 0) || !window.fetch || !window.DOMParser) {
        return;
    }
    const stamp = document.querySelector("[data-leasing-updated]");
    let busy = false;
    let updatedAt = new Date(); // when the figures shown were read: the page load, then each swap
    let signedOut = false;

    class SessionEnded extends Error {}

    function selecting() {
        return document.querySelector("tr input.action-select:checked, #action-toggle:checked");
    }

    function openKeys(scope) {
        return new Set(Array.from(scope.querySelectorAll("details[open][data-key]"), (d) => d.dataset.key));
    }

    function swap(panel, fresh) {
        const open = openKeys(panel);
        panel.replaceChildren(...Array.from(fresh.childNodes, (node) => document.importNode(node, true)));
        panel.querySelectorAll("details[data-key]").forEach((d) => {
            if (open.has(d.dataset.key)) {
                d.open = true;
            }
        });
    }

    async function refresh() {
        if (busy || document.visibilityState === "hidden" || selecting()) {
            return;
        }
        busy = true;
        try {
            const response = await fetch(window.location.href, {
                headers: {"X-Leasing-Fragment": "1"},
                credentials: "same-origin",
                cache: "no-store",
            });
            if (!response.ok) {
                throw new Error("HTTP " + response.status);
            }
            const doc = new DOMParser().parseFromString(await response.text(), "text/html");
            const pairs = Array.from(document.querySelectorAll("[data-leasing-panel]"), (panel) => [
                panel,
                doc.querySelector(`[data-leasing-panel="${CSS.escape(panel.dataset.leasingPanel)}"]`),
            ]).filter(([, fresh]) => fresh);
            if (!pairs.length) {
                // A console page's GET redirects nowhere but to the login page (signed out).
                if (response.redirected || doc.getElementById("login-form")) {
                    throw new SessionEnded(response.url);
                }
                throw new Error("the answer has none of this page's panels");
            }
            if (selecting()) {
                return; // a row was ticked while the answer was on its way: keep the selection
            }
            pairs.forEach(([panel, fresh]) => swap(panel, fresh));
            const swapped = pairs.length;
            const rows = document.querySelectorAll("tr input.action-select");
            if (rows.length && window.Actions) {
                window.Actions(rows);
            }
            updatedAt = new Date();
            signedOut = false;
            if (stamp) {
                stamp.textContent = "updated " + updatedAt.toLocaleTimeString();
                stamp.classList.remove("leasing-bad-text");
            }
            document.dispatchEvent(new CustomEvent("leasing:refreshed", {detail: {panels: swapped}}));
        } catch (error) {
            signedOut = error instanceof SessionEnded;
            if (stamp && signedOut) {
                // Reloading goes through the login page and back to this one.
                const reload = document.createElement("a");
                reload.href = window.location.href;
                reload.textContent = "reload to sign in again";
                stamp.replaceChildren(
                    "session ended: these figures are from " + updatedAt.toLocaleTimeString() +
                    " and no longer live; ",
                    reload,
                );
                stamp.classList.add("leasing-bad-text");
            } else if (stamp) {
                stamp.textContent = "refresh failed (" + error.message + "); retrying";
                stamp.classList.add("leasing-bad-text");
            }
        } finally {
            busy = false;
        }
    }

    let timer = null;

    function hidden() {
        return document.visibilityState === "hidden";
    }

    function schedule() {
        window.clearTimeout(timer);
        timer = null;
        const state = signedOut ? "signed-out" : "live";
        document.documentElement.dataset.leasingRefreshState = hidden() ? "paused" : state;
        if (hidden()) {
            if (stamp) {
                stamp.textContent = "paused while the tab is hidden";
            }
            return;
        }
        timer = window.setTimeout(async () => {
            await refresh();
            schedule();
        }, seconds * 1000);
    }

    document.addEventListener("visibilitychange", async () => {
        if (hidden()) {
            schedule(); // stops the timer
            return;
        }
        await refresh();
        schedule();
    });
    schedule();
})();
