// Draws the dashboard's charts with uPlot (dashboard/static/vendor/uplot, vendored from npm). The server sends
// every series already in its unit with the text of every value (dashboard/charts.py): this file only draws,
// shows the tooltip and keeps each chart as wide as its box. The table beside each chart holds the same figures.
(function () {
  "use strict";

  function stackedData(spec) {
    // uPlot draws series in order: the running totals are drawn from the top down so each bar shows its part.
    var n = spec.labels.length;
    var running = new Array(n).fill(0);
    var tops = spec.series.map(function (s) {
      running = running.map(function (v, i) { return v + s.values[i]; });
      return running.slice();
    });
    return tops.reverse();
  }

  function draw(figure) {
    var spec = JSON.parse(document.getElementById(figure.dataset.chart).textContent);
    var plot = figure.querySelector(".plot");
    var tooltip = figure.querySelector(".chart-tooltip");
    if (!plot || !spec.labels.length) return;
    var xs = spec.labels.map(function (_, i) { return i; });
    var ordered = spec.stacked ? spec.series.slice().reverse() : spec.series;
    var ys = spec.stacked ? stackedData(spec) : spec.series.map(function (s) { return s.values; });
    var bars = uPlot.paths.bars({ size: [0.7, 60], align: 0 });
    var series = [{}].concat(ordered.map(function (s) {
      return spec.stacked
        ? { label: s.name, stroke: s.colour, fill: s.colour, width: 0, paths: bars, points: { show: false } }
        : { label: s.name, stroke: s.colour, width: 2, points: { show: spec.labels.length < 60, size: 5 } };
    }));
    var every = function (count) { return Math.max(1, Math.ceil(count / Math.max(2, plot.clientWidth / 70))); };
    var opts = {
      width: Math.max(200, plot.clientWidth),
      height: plot.clientWidth < 500 ? 200 : 260,
      legend: { live: false },
      cursor: { points: { show: !spec.stacked }, drag: { x: false, y: false } },
      scales: {
        x: { time: false, range: function () { return [-0.5, xs.length - 0.5]; } },
        y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.05 : 1]; } },
      },
      axes: [
        {
          splits: function () {
            var step = every(xs.length);
            return xs.filter(function (i) { return i % step === 0; });
          },
          values: function (u, splits) { return splits.map(function (i) { return spec.labels[i] || ""; }); },
          size: 40,
        },
        {
          label: spec.unit,
          size: function (u, values) {
            var longest = (values || []).reduce(function (m, v) { return Math.max(m, String(v).length); }, 0);
            return 24 + longest * 7;
          },
        },
      ],
      series: series,
      hooks: {
        setCursor: [function (u) {
          var i = u.cursor.idx;
          if (i == null || u.cursor.left < 0) { tooltip.style.display = "none"; return; }
          var lines = [spec.labels[i]].concat(spec.series.map(function (s) {
            return s.name + ": " + s.texts[i];
          }));
          tooltip.textContent = lines.join("\n");
          tooltip.style.whiteSpace = "pre";
          tooltip.style.display = "block";
          var over = u.over.getBoundingClientRect();
          var box = figure.getBoundingClientRect();
          var left = over.left - box.left + u.cursor.left + 12;
          var maxLeft = box.width - tooltip.offsetWidth - 4;
          tooltip.style.left = Math.max(0, Math.min(left, maxLeft)) + "px";
          tooltip.style.top = (over.top - box.top + Math.max(0, u.cursor.top - 40)) + "px";
        }],
      },
    };
    var chart = new uPlot(opts, [xs].concat(ys), plot);
    new ResizeObserver(function () {
      var width = Math.max(200, plot.clientWidth);
      if (Math.abs(width - chart.width) > 2) chart.setSize({ width: width, height: width < 500 ? 200 : 260 });
    }).observe(plot);
  }

  function drawAll(root) {
    (root || document).querySelectorAll("figure.chart[data-chart]").forEach(function (figure) {
      if (!figure.dataset.drawn) { figure.dataset.drawn = "1"; draw(figure); }
    });
  }

  window.carbonCharts = { drawAll: drawAll };
  // The range picker: typing a day means a custom range; choosing a preset fills its days in on the server.
  function rangeForm() {
    var preset = document.getElementById("id_preset");
    if (!preset) return;
    ["id_start", "id_end"].forEach(function (id) {
      var input = document.getElementById(id);
      if (input) input.addEventListener("input", function () { preset.value = ""; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () { rangeForm(); drawAll(document); });
})();
