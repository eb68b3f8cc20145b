// jobfence dashboard: live updates over /v1/events and the force-release
// dialog. Every page works without this file; it only enhances.
(function () {
	"use strict";

	var status = document.getElementById("live-status");
	function say(msg) {
		if (status) status.textContent = msg;
	}

	// Dialogs: the trigger is a link to the no-script release page; with
	// script it opens the <dialog> rendered next to it instead.
	document.addEventListener("click", function (e) {
		var opener = e.target.closest("[data-open-dialog]");
		if (opener) {
			var dlg = document.getElementById(opener.getAttribute("data-open-dialog"));
			if (dlg && typeof dlg.showModal === "function") {
				e.preventDefault();
				var err = dlg.querySelector("[data-error]");
				if (err) err.textContent = "";
				dlg.showModal();
			}
			return;
		}
		var closer = e.target.closest("[data-close-dialog]");
		if (closer) {
			var d = closer.closest("dialog");
			if (d) d.close();
		}
	});

	document.addEventListener("submit", function (e) {
		var form = e.target;
		if (!form.matches("form[data-fetch]")) return;
		e.preventDefault();
		var err = form.querySelector("[data-error]");
		var button = form.querySelector("button[type=submit]");
		var body = new URLSearchParams(new FormData(form));
		if (button) button.disabled = true;
		fetch(form.action, {
			method: "POST",
			credentials: "same-origin",
			headers: { "X-CSRF-Token": body.get("csrf") || "", "Accept": "text/plain" },
			body: body
		}).then(function (res) {
			return res.text().then(function (text) {
				if (!res.ok) {
					if (err) err.textContent = text || ("Refused with status " + res.status);
					return;
				}
				var dlg = form.closest("dialog");
				if (dlg) dlg.close();
				say(text);
			});
		}).catch(function (x) {
			if (err) err.textContent = "The request failed: " + x.message;
		}).finally(function () {
			if (button) button.disabled = false;
		});
	});

	// Live updates: any change re-reads this page and swaps <main>, so what
	// the page shows always comes from the server's own rendering.
	if (document.body.getAttribute("data-live") !== "true" || !window.EventSource) return;

	var timer = null;
	var deferred = false;
	var inflight = false;

	function editing() {
		var a = document.activeElement;
		return !!(a && a.closest("#main") && a.matches("input:not([type=hidden]), select, textarea"));
	}

	function schedule() {
		if (timer) clearTimeout(timer);
		timer = setTimeout(refresh, 100);
	}

	function refresh() {
		timer = null;
		// Never pull a form out from under someone typing: an open dialog's
		// note, or a filter field being edited, waits until they are done.
		if (document.querySelector("dialog[open]") || editing()) {
			deferred = true;
			return;
		}
		if (inflight) {
			deferred = true;
			return;
		}
		inflight = true;
		fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
			.then(function (res) {
				if (res.redirected || !res.ok) throw new Error("status " + res.status);
				return res.text();
			})
			.then(function (html) {
				var next = new DOMParser().parseFromString(html, "text/html").getElementById("main");
				var cur = document.getElementById("main");
				if (next && cur && !document.querySelector("dialog[open]") && !editing()) {
					cur.replaceWith(document.importNode(next, true));
				} else if (next) {
					deferred = true;
				}
			})
			.catch(function () {
				say("Live update failed; the page may be out of date.");
			})
			.finally(function () {
				inflight = false;
				if (deferred && !document.querySelector("dialog[open]") && !editing()) {
					deferred = false;
					schedule();
				}
			});
	}

	function resume() {
		if (deferred) {
			deferred = false;
			schedule();
		}
	}
	document.addEventListener("close", resume, true);
	document.addEventListener("focusout", function () {
		// focusout fires before the next element has focus; wait one turn.
		setTimeout(resume, 0);
	});

	var es = new EventSource("/v1/events");
	["job", "fence", "slot", "agent", "settings", "change"].forEach(function (kind) {
		es.addEventListener(kind, schedule);
	});
	es.addEventListener("open", function () {
		document.body.setAttribute("data-stream", "open");
	});
	es.addEventListener("error", function () {
		document.body.setAttribute("data-stream", "reconnecting");
	});
})();
