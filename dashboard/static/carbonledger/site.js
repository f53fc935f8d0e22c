// What every page does in the browser: a table wider than the screen scrolls in its own box (site.css); such a
// box is made reachable by keyboard (tabindex) and named, so it can be scrolled without a mouse.
(function () {
  "use strict";
  function focusableScrollers() {
    document.querySelectorAll("main table").forEach(function (table) {
      var scrolls = table.scrollWidth > table.clientWidth + 1;
      if (scrolls && !table.hasAttribute("tabindex")) {
        table.setAttribute("tabindex", "0");
        if (!table.querySelector("caption") && !table.hasAttribute("aria-label")) {
          var heading = table.previousElementSibling;
          table.setAttribute("aria-label", heading && /^H[1-6]$/.test(heading.tagName) ? heading.textContent : "table");
        }
      } else if (!scrolls && table.getAttribute("tabindex") === "0") {
        table.removeAttribute("tabindex");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", focusableScrollers);
  window.addEventListener("resize", focusableScrollers);
  window.carbonSite = { focusableScrollers: focusableScrollers };
})();
