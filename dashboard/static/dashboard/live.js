/* The dashboard's live engine figures over a WebSocket (channels): running and queued requests and
   tokens per second every second, over all models and for each (one engine per model), and a count
   of requests recorded since the page loaded.  Reconnects with a growing delay when the connection
   drops. */
(function () {
  "use strict";

  var root = document.getElementById("live");
  if (!root || !("WebSocket" in window)) return;

  function field(name) {
    return root.querySelector('[data-live="' + name + '"]');
  }

  var seen = { requests: 0, tokens: 0 };
  var delay = 1000;

  function set(name, value) {
    var element = field(name);
    if (element) element.textContent = value;
  }

  function cell(row, text, numeric) {
    var td = document.createElement("td");
    td.textContent = text;
    if (numeric) td.className = "num";
    row.appendChild(td);
  }

  function showModels(models) {
    var body = field("models");
    if (!body || !models) return;
    body.textContent = "";
    models.forEach(function (model) {
      var row = document.createElement("tr");
      row.dataset.model = model.model;
      cell(row, model.model, false);
      cell(row, model.ready ? "ready" : "loading", false);
      cell(row, model.running, true);
      cell(row, model.waiting, true);
      cell(row, model.tokens_per_second.toFixed(1), true);
      body.appendChild(row);
    });
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + root.dataset.path);
    socket.onopen = function () {
      delay = 1000;
      root.dataset.state = "connected";
      set("state", "live");
    };
    socket.onmessage = function (message) {
      var event = JSON.parse(message.data);
      if (event.type === "engine") {
        set("running", event.running === undefined ? "–" : event.running);
        set("waiting", event.waiting === undefined ? "–" : event.waiting);
        set("tokens_per_second", event.tokens_per_second === undefined ? "–" : event.tokens_per_second.toFixed(1));
        set("ready", event.ready ? "ready" : "loading");
        showModels(event.models);
        root.dataset.updates = String(Number(root.dataset.updates || 0) + 1);
      } else if (event.type === "usage") {
        seen.requests += 1;
        seen.tokens += event.input_tokens + event.output_tokens;
        set("requests", seen.requests);
        set("tokens", seen.tokens);
      }
    };
    socket.onclose = function () {
      root.dataset.state = "disconnected";
      set("state", "reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }

  connect();
})();
