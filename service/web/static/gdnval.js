// gdnval pages: live refresh without a manual reload. Vanilla JS, no dependencies.
// Pages work without it; it only keeps queued/running jobs up to date.
(function () {
  "use strict";
  var PERIOD_MS = 2000;

  // Job list: the tbody names a partial endpoint; refresh it every 2 s while a job is queued or
  // running, every 10 s otherwise (so newly submitted jobs appear too).
  var IDLE_MS = 10000;
  function pollRows(tbody) {
    var url = tbody.getAttribute("data-poll");
    function next(active) { setTimeout(tick, active ? PERIOD_MS : IDLE_MS); }
    function tick() {
      if (document.hidden) { next(false); return; }
      fetch(url, { headers: { "Accept": "text/html" }, cache: "no-store" })
        .then(function (r) {
          if (!r.ok) { throw new Error(r.status); }
          var active = r.headers.get("X-Active-Jobs");
          return r.text().then(function (html) { return { html: html, active: active }; });
        })
        .then(function (res) {
          if (tbody.innerHTML !== res.html) { tbody.innerHTML = res.html; }
          tbody.setAttribute("data-active", res.active || "0");
          tbody.setAttribute("data-refreshed", String(Date.now()));
          next(res.active && res.active !== "0");
        })
        .catch(function () { setTimeout(tick, IDLE_MS); });
    }
    next(tbody.getAttribute("data-active") !== "0");
  }

  // Job page: poll the job's progress; reload once when it settles so the matrices appear.
  function pollJob(el) {
    var url = el.getAttribute("data-poll-json");
    function tick() {
      fetch(url, { cache: "no-store" })
        .then(function (r) { return r.json(); })
        .then(function (j) {
          var bar = el.querySelector(".progress");
          if (bar) {
            var pct = j.total > 0 ? Math.round(100 * j.done / j.total) : 0;
            bar.firstElementChild.style.width = pct + "%";
            bar.setAttribute("aria-valuenow", j.done);
            bar.setAttribute("aria-valuemax", j.total);
            var count = bar.nextElementSibling;
            if (count) { count.textContent = j.done + "/" + j.total; }
          }
          var msg = document.getElementById("job-progress-msg");
          if (msg) { msg.textContent = j.message || ""; }
          if (j.status !== el.getAttribute("data-status")) { window.location.reload(); return; }
          setTimeout(tick, PERIOD_MS);
        })
        .catch(function () { setTimeout(tick, PERIOD_MS * 3); });
    }
    var s = el.getAttribute("data-status");
    if (s === "queued" || s === "running") { setTimeout(tick, PERIOD_MS); }
  }

  // Job page: each case's plots are a fragment fetched when the case comes near the screen, so
  // a page of many cases does not carry every case's SVG before anyone scrolls to it.
  function loadPlots(el) {
    if (el.getAttribute("data-loaded")) { return; }
    el.setAttribute("data-loaded", "pending");
    fetch(el.getAttribute("data-plots"), { headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) { el.innerHTML = html; el.setAttribute("data-loaded", "yes"); })
      .catch(function (e) {
        el.textContent = "Plots could not be loaded (" + e.message + ").";
        el.setAttribute("data-loaded", "failed");
      });
  }
  function watchPlots(els) {
    if (!("IntersectionObserver" in window)) { els.forEach(loadPlots); return; }
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { seen.unobserve(e.target); loadPlots(e.target); }
      });
    }, { rootMargin: "800px 0px" });
    els.forEach(function (el) { seen.observe(el); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(pollRows);
    document.querySelectorAll("[data-poll-json]").forEach(pollJob);
    watchPlots(Array.prototype.slice.call(document.querySelectorAll("[data-plots]")));
  });
})();
