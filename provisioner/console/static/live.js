// Live updates without a reload: every few seconds, fetch this page's live part
// (?fragment=1, rendered by the server) and put it in place. Nothing else runs here.
(function () {
  "use strict";
  var region = document.getElementById("live");
  var every = region ? Number(region.dataset.every || "0") : 0;
  if (!every) {
    return;
  }
  var refreshes = 0;
  function refresh() {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== region.dataset.last) {
          region.innerHTML = html;
          region.dataset.last = html;
        }
        refreshes += 1;
        document.body.dataset.refreshes = String(refreshes);
      })
      .catch(function () {})
      .then(function () {
        window.setTimeout(refresh, every);
      });
  }
  window.setTimeout(refresh, every);
})();
