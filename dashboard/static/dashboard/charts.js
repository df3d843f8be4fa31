/* Usage charts (Chart.js, vendored): every <canvas data-chart="ID"> draws the JSON of the
   <script type="application/json" id="ID"> made by Django's json_script: bars of input and output
   tokens per bucket, lines of requests and errors on a second axis.  Pages work without this
   file; only the charts need it. */
(function () {
  "use strict";

  var COLORS = {
    input: "#4f7fd9",
    output: "#9bb8ee",
    requests: "#1f9d6b",
    errors: "#d9534f",
  };

  function draw(canvas) {
    var source = document.getElementById(canvas.dataset.chart);
    if (!source || typeof Chart === "undefined") return null;
    var data = JSON.parse(source.textContent);
    var datasets = [
      { type: "bar", label: "Input tokens", data: data.input_tokens, backgroundColor: COLORS.input, stack: "tokens", yAxisID: "tokens" },
      { type: "bar", label: "Output tokens", data: data.output_tokens, backgroundColor: COLORS.output, stack: "tokens", yAxisID: "tokens" },
      { type: "line", label: "Requests", data: data.requests, borderColor: COLORS.requests, backgroundColor: COLORS.requests, yAxisID: "requests", tension: 0.2, pointRadius: 2 },
    ];
    if (canvas.dataset.errors !== undefined) {
      datasets.push({ type: "line", label: "Errors", data: data.errors, borderColor: COLORS.errors, backgroundColor: COLORS.errors, yAxisID: "requests", tension: 0.2, pointRadius: 2 });
    }
    return new Chart(canvas, {
      data: { labels: data.labels, datasets: datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        interaction: { mode: "index", intersect: false },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
        scales: {
          x: { stacked: true, ticks: { maxRotation: 0, autoSkipPadding: 12 } },
          tokens: { type: "linear", position: "left", stacked: true, beginAtZero: true, title: { display: true, text: "tokens" } },
          requests: { type: "linear", position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "requests" }, ticks: { precision: 0 } },
        },
      },
    });
  }

  function drawAll() {
    document.querySelectorAll("canvas[data-chart]").forEach(draw);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
