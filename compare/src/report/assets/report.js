(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var failed = false;
  function fail(e) {
    if (failed) return;
    failed = true;
    document.body.dataset.plot = "error";
    var div = document.createElement("div");
    div.className = "plot-error";
    div.setAttribute("role", "alert");
    div.textContent = "The plot could not be drawn: " + (e && e.stack ? e.stack : String(e));
    var at = document.getElementById("plot-section") || document.body;
    at.appendChild(div);
  }
  window.addEventListener("error", function (ev) { fail(ev.error || ev.message); });
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(x) {
    if (x === null || !isFinite(x)) return x === Infinity ? "inf" : "NaN";
    var a = Math.abs(x);
    if (a === 0) return "0";
    if (a < 0.01 || a >= 1e4) return x.toExponential(1).replace("e+", "e");
    if (a >= 100) return x.toFixed(0);
    if (a >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }
  function ratio(err, tol) {
    // null is how JSON carries NaN and Inf: a non-finite error.
    if (err === null || tol === null) return NaN;
    if (tol > 0) return err / tol;
    return err === 0 ? 0 : Infinity;
  }
  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac", "#e15759"];
  function color(i) {
    return i < PALETTE.length ? PALETTE[i] : "hsl(" + ((i * 137.508) % 360).toFixed(0) + ",60%,45%)";
  }

  function draw() {
    var report = JSON.parse(document.getElementById("report-data").textContent);
    if (!report || !Array.isArray(report.tensors)) throw new Error("no report data");
    var tensors = report.tensors;
    var svg = document.getElementById("plot");
    var W = 1100, H = 440, L = 64, R = 96, T = 18, B = 44;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);

    // Per rank, the points (tensor index, ratio).
    var byRank = new Map();
    var lo = Infinity, hi = 0, pmin = Infinity, pmax = -Infinity;
    tensors.forEach(function (t, i) {
      pmin = Math.min(pmin, t.position);
      pmax = Math.max(pmax, t.position);
      (t.ranks || []).forEach(function (r) {
        var y = ratio(r.error_eps, t.tolerance_eps);
        if (isFinite(y) && y > 0) { lo = Math.min(lo, y); hi = Math.max(hi, y); }
        if (!byRank.has(r.rank)) byRank.set(r.rank, []);
        byRank.get(r.rank).push([i, y]);
      });
    });
    var ranks = Array.from(byRank.keys()).sort(function (a, b) { return a - b; });
    if (!isFinite(pmin)) { pmin = 0; pmax = 1; }
    if (pmin === pmax) { pmin -= 1; pmax += 1; }
    var kLo = isFinite(lo) ? Math.max(-8, Math.min(-1, Math.floor(Math.log10(lo)))) : -2;
    var kHi = hi > 0 ? Math.min(15, Math.max(1, Math.ceil(Math.log10(hi)))) : 1;
    var X = function (p) { return L + (p - pmin) / (pmax - pmin) * (W - L - R); };
    // Non-finite ratios (NaN or Inf errors) get their own band above the top decade.
    var offscale = false;
    tensors.forEach(function (t) {
      (t.ranks || []).forEach(function (r) { if (!isFinite(ratio(r.error_eps, t.tolerance_eps))) offscale = true; });
    });
    var TOP = offscale ? T + 22 : T;
    // Exact matches (error 0) get theirs below the bottom decade.
    var exact = tensors.some(function (t) {
      return (t.ranks || []).some(function (r) { return ratio(r.error_eps, t.tolerance_eps) === 0; });
    });
    var BOT = exact ? H - B - 22 : H - B;
    var Y = function (y) {
      if (!isFinite(y)) return T;
      if (y === 0) return H - B;
      var k = y > 0 ? Math.log10(y) : kLo;
      if (k > kHi) k = kHi;
      if (k < kLo) k = kLo;
      return TOP + (kHi - k) / (kHi - kLo) * (BOT - TOP);
    };

    // Axes: decades on y, round numbers on x, step boundaries.
    var axis = el("g", { class: "axis" }, svg);
    for (var k = kLo; k <= kHi; k++) {
      var y = Y(Math.pow(10, k));
      el("line", { x1: L, x2: W - R, y1: y, y2: y }, axis);
      text(axis, L - 6, y + 4, k === 0 ? "1" : k === 1 ? "10" : k === -1 ? "0.1" : "1e" + k, { "text-anchor": "end" });
    }
    if (exact) {
      el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "grid-line" }, axis);
      text(axis, L - 6, H - B + 4, "exact", { "text-anchor": "end" });
    }
    if (offscale) {
      el("line", { x1: L, x2: W - R, y1: T, y2: T, class: "grid-line" }, axis);
      text(axis, L - 6, T + 4, "NaN/inf", { "text-anchor": "end" });
    }
    var span = pmax - pmin, raw = span / 8, p10 = Math.pow(10, Math.floor(Math.log10(raw)));
    var stepX = [1, 2, 5, 10].map(function (m) { return m * p10; }).find(function (s) { return s >= raw; }) || raw;
    for (var x = Math.ceil(pmin / stepX) * stepX; x <= pmax; x += stepX) {
      el("line", { x1: X(x), x2: X(x), y1: H - B, y2: H - B + 5 }, axis);
      text(axis, X(x), H - B + 17, String(Math.round(x)), { "text-anchor": "middle" });
    }
    text(axis, (L + W - R) / 2, H - 6, "position in the reference's op sequence", { "text-anchor": "middle" });
    text(axis, 14, (T + H - B) / 2, "error / tolerance", { "text-anchor": "middle", transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" });
    for (var i = 1; i < tensors.length; i++) {
      if (tensors[i].step !== tensors[i - 1].step) {
        var sx = X((tensors[i].position + tensors[i - 1].position) / 2);
        el("line", { class: "step-line", x1: sx, x2: sx, y1: T, y2: H - B }, svg);
        text(svg, sx + 3, TOP + 10, "step " + tensors[i].step, { class: "tick" });
      }
    }
    if (tensors.length) text(svg, X(tensors[0].position) + 3, TOP + 10, "step " + tensors[0].step, { class: "tick" });

    // The tolerance line at 1.
    el("line", { id: "tolerance-line", class: "tolerance", x1: L, x2: W - R, y1: Y(1), y2: Y(1) }, svg);
    text(svg, W - R + 4, Y(1) + 4, "tolerance", { class: "label" });

    // One path per rank, a round dot per point: cheap for a million points.
    var points = 0;
    var legend = document.getElementById("legend");
    ranks.forEach(function (rank, ri) {
      var pts = byRank.get(rank), d = [];
      pts.forEach(function (p) {
        d.push("M" + X(tensors[p[0]].position).toFixed(1) + " " + Y(p[1]).toFixed(1) + "h0");
      });
      points += pts.length;
      var path = el("path", { class: "series", d: d.join(""), stroke: color(ri), "data-rank": rank, "data-points": pts.length }, svg);
      var item = document.createElement("span");
      item.innerHTML = "<i></i>";
      item.firstChild.style.background = color(ri);
      item.appendChild(document.createTextNode("rank " + rank));
      item.title = "show or hide rank " + rank;
      item.addEventListener("click", function () {
        item.classList.toggle("off");
        path.style.display = item.classList.contains("off") ? "none" : "";
      });
      legend.appendChild(item);
    });
    if (!points) text(svg, (L + W - R) / 2, (T + H - B) / 2, "no tensors compared", { "text-anchor": "middle" });

    // The first divergence: a vertical line and a ring on each diverging rank's point.
    var fd = report.first_divergence;
    if (fd && tensors[fd.tensor]) {
      var t = tensors[fd.tensor], mx = X(t.position);
      var g = el("g", { id: "divergence-marker", "data-position": t.position, "data-tensor": fd.tensor }, svg);
      el("line", { class: "marker", x1: mx, x2: mx, y1: T, y2: H - B }, g);
      (t.ranks || []).forEach(function (r) {
        if ((fd.ranks || []).indexOf(r.rank) >= 0) {
          el("circle", { class: "marker-ring", cx: mx, cy: Y(ratio(r.error_eps, t.tolerance_eps)), r: 7 }, g);
        }
      });
      var right = mx > (L + W - R) / 2;
      text(g, mx + (right ? -6 : 6), TOP + 24, "first divergence: pos " + t.position + " " + (t.nvtx || t.api) + " " + t.role,
        { class: "label bad", "text-anchor": right ? "end" : "start", fill: "#c62828" });
    }

    // Hover: the tensors at the nearest position.
    var positions = [], atPos = new Map();
    tensors.forEach(function (t, i) {
      if (!atPos.has(t.position)) { atPos.set(t.position, []); positions.push(t.position); }
      atPos.get(t.position).push(i);
    });
    positions.sort(function (a, b) { return a - b; });
    var tip = document.getElementById("tooltip");
    var hover = el("line", { class: "hover", y1: T, y2: H - B, visibility: "hidden" }, svg);
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var vx = (ev.clientX - box.left) / box.width * W;
      var p = pmin + (vx - L) / (W - L - R) * (pmax - pmin);
      var a = 0, b = positions.length - 1;
      if (b < 0) return;
      while (a < b) { var m = (a + b) >> 1; if (positions[m] < p) a = m + 1; else b = m; }
      if (a > 0 && Math.abs(positions[a - 1] - p) < Math.abs(positions[a] - p)) a--;
      var pos = positions[a];
      hover.setAttribute("x1", X(pos)); hover.setAttribute("x2", X(pos));
      hover.setAttribute("visibility", "visible");
      var rows = atPos.get(pos).map(function (i) {
        var t = tensors[i], worst = null;
        (t.ranks || []).forEach(function (r) {
          var y = ratio(r.error_eps, t.tolerance_eps);
          if (worst === null || !(y <= worst[1])) worst = [r.rank, y];
        });
        return (t.diverged ? "<b class=\"bad\">" : "<b>") + esc((t.nvtx || "-") + " " + t.role) + "</b> " +
          esc(t.api + " [" + t.shape.join(", ") + "] " + t.dtype) + "<br>error " + fmt(t.error_eps) + " eps, tolerance " +
          fmt(t.tolerance_eps) + " eps: " + fmt(ratio(t.error_eps, t.tolerance_eps)) + "x" +
          (worst ? "; worst rank " + worst[0] + " at " + fmt(worst[1]) + "x" : "");
      });
      tip.innerHTML = "<div>position " + pos + ", step " + tensors[atPos.get(pos)[0]].step + "</div>" + rows.join("<br>");
      tip.hidden = false;
      var left = ev.clientX - box.left + 14;
      tip.style.left = Math.min(left, box.width - 300) + "px";
      tip.style.top = (ev.clientY - box.top + 14) + "px";
    });
    svg.addEventListener("mouseleave", function () { tip.hidden = true; hover.setAttribute("visibility", "hidden"); });

    svg.setAttribute("data-points", points);
    return points;
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" }[c];
    });
  }
  try {
    draw();
    if (!failed) document.body.dataset.plot = "rendered";
  } catch (e) {
    fail(e);
  }
})();
