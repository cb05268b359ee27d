// idem review page: what a script adds to a page that works without one.
//
// - Live regions ([data-live]) refresh every 10 seconds, by fetching the
//   same page and swapping in each region's new version. A region that
//   holds the focus, or a field or box the operator changed, is left as it
//   is: nothing being typed or ticked is ever lost. The status line says
//   when the page last refreshed.
// - Copy buttons ([data-copy]) copy a long value (a scope, a fingerprint,
//   a short ID) to the clipboard.
// - The bulk form's "select all" box, and a count of the keys selected.
//
// No markup from the network is run: regions come from this server's own
// page, parsed as an inert document, and only text is set otherwise.
"use strict";

(function () {
  var main = document.getElementById("main");
  var PERIOD = Number(main && main.getAttribute("data-refresh")) || 10000;
  var every = "refreshes every " + Math.round(PERIOD / 1000) + " s.";
  var status = document.getElementById("live-status");

  // changed reports whether a form field in el differs from what the page
  // sent, or has the focus.
  function busy(el) {
    if (el.contains(document.activeElement) && document.activeElement !== document.body) {
      return true;
    }
    var fields = el.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].selected !== f.options[j].defaultSelected) return true;
        }
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function say(text) {
    if (status) status.textContent = text;
  }

  function clock() {
    var d = new Date();
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  var inflight = false;
  function refresh() {
    if (inflight || document.hidden || !document.querySelector("[data-live]")) return;
    inflight = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Idem-Refresh": "1" }, redirect: "follow" })
      .then(function (res) {
        if (res.redirected && /\/login$/.test(new URL(res.url).pathname)) {
          throw new Error("Your session has ended: reload the page to sign in again.");
        }
        if (!res.ok) throw new Error("Refresh failed (" + res.status + "); showing the page as of its last refresh.");
        return res.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var kept = 0;
        document.querySelectorAll("[data-live]").forEach(function (old) {
          var fresh = doc.querySelector('[data-live="' + old.getAttribute("data-live") + '"]');
          if (!fresh) return;
          if (busy(old)) {
            kept++;
            return;
          }
          old.replaceWith(document.importNode(fresh, true));
        });
        wire();
        say("Updated at " + clock() + (kept ? "; the parts you are working on were left as they are." : "; " + every));
      })
      .catch(function (err) {
        say(err.message || "Refresh failed; showing the page as of its last refresh.");
      })
      .then(function () { inflight = false; });
  }

  function copy(btn) {
    var text = btn.getAttribute("data-copy");
    var done = function () {
      var label = btn.textContent;
      btn.textContent = "Copied";
      setTimeout(function () { btn.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallback(text); done(); });
    } else {
      fallback(text);
      done();
    }
  }

  // fallback copies through a selected, off-screen text area, where the
  // clipboard API is not offered (plain HTTP on another host than
  // localhost).
  function fallback(text) {
    var ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.className = "sr";
    document.body.appendChild(ta);
    ta.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing more to try */ }
    ta.remove();
  }

  function selected(form) {
    return form.querySelectorAll('input[name="k"]:checked').length;
  }

  function updateCount(form) {
    var out = form.querySelector("[data-selected]");
    var n = selected(form);
    if (out) out.textContent = n === 0 ? "No key selected" : n + " key" + (n === 1 ? "" : "s") + " selected";
    form.querySelectorAll("button[data-needs-selection]").forEach(function (b) { b.disabled = n === 0; });
  }

  // wire gives the elements of a (new) region their behaviour.
  function wire() {
    document.querySelectorAll("button[data-copy]").forEach(function (btn) {
      if (btn.dataset.wired) return;
      btn.dataset.wired = "1";
      btn.hidden = false;
      btn.addEventListener("click", function () { copy(btn); });
    });
    document.querySelectorAll("form[data-bulk]").forEach(function (form) {
      if (form.dataset.wired) return;
      form.dataset.wired = "1";
      var all = form.querySelector("input[data-select-all]");
      if (all) {
        all.hidden = false;
        all.closest("label").hidden = false;
        all.addEventListener("change", function () {
          form.querySelectorAll('input[name="k"]').forEach(function (box) { box.checked = all.checked; });
          updateCount(form);
        });
      }
      form.addEventListener("change", function () { updateCount(form); });
    });
    document.querySelectorAll("form[data-bulk]").forEach(updateCount);
  }

  wire();
  if (document.querySelector("[data-live]")) {
    say("Loaded at " + clock() + "; " + every);
    setInterval(refresh, PERIOD);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  }
})();
