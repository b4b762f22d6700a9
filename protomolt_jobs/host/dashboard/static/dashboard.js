// Live updates: re-render the page's [data-live] region every few seconds (no framework);
// paused while jobs are ticked for a bulk action.
(function () {
  "use strict";
  var region = document.querySelector("[data-live]");
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!region || !seconds) { return; }
  function refresh() {
    if (document.hidden) { return; }
    // a selection for a bulk action lives in the region: keep it until it is used
    if (region.querySelector("input.pick:checked")) { return; }
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { region.innerHTML = html; } })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, seconds * 1000);
})();
