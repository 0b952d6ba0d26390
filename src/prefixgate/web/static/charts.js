/* prefixgate dashboard: small SVG charts (time lines, stacked columns, histograms). */
"use strict";

const PGChart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#0f766e", "#6366f1", "#d97706", "#db2777", "#0284c7", "#65a30d"];
  const OTHER = "#94a3b8";
  const M = { top: 12, right: 16, bottom: 28, left: 52 };

  function color(i, name) { return name === "other" ? OTHER : PALETTE[i % PALETTE.length]; }

  function s(tag, attrs, parent) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, v);
    if (parent) parent.appendChild(el);
    return el;
  }

  function niceStep(range, count) {
    const raw = range / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    const n = raw / mag;
    return (n <= 1 ? 1 : n <= 2 ? 2 : n <= 2.5 ? 2.5 : n <= 5 ? 5 : 10) * mag;
  }

  function yTicks(max, count = 4) {
    if (!(max > 0)) return { max: 1, ticks: [0, 0.25, 0.5, 0.75, 1] };
    const step = niceStep(max, count);
    const top = Math.ceil(max / step - 1e-9) * step;
    const ticks = [];
    for (let v = 0; v <= top + step / 2; v += step) ticks.push(v);
    return { max: top, ticks };
  }

  const TIME_STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  function timeTicks(t0, t1, count = 6) {
    const span = Math.max(t1 - t0, 1e-3);
    const step = TIME_STEPS.find((st) => span / st <= count) || TIME_STEPS[TIME_STEPS.length - 1];
    const ticks = [];
    for (let t = Math.ceil(t0 / step - 1e-9) * step; t <= t1 + 1e-9; t += step) ticks.push(t);
    const f = PG.fmt;
    const label = step < 1 ? (t) => f.clock(t, true).slice(0, 10)
      : step < 60 ? (t) => f.clock(t)
      : step < 86400 ? (t) => f.clock(t).slice(0, 5)
      : (t) => f.date(t).slice(5);
    return { ticks, label };
  }

  function frame(container, height, extraTop = 0) {
    const width = Math.max(320, Math.floor(container.clientWidth || 600));
    const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, height, class: "pg-chart", role: "img" });
    const top = M.top + extraTop;
    return { svg, width, height, top, iw: width - M.left - M.right, ih: height - top - M.bottom };
  }

  function yAxis(svg, f, ticks, yFormat, y) {
    const g = s("g", { class: "grid" }, svg);
    const a = s("g", { class: "axis" }, svg);
    for (const v of ticks) {
      const yy = y(v);
      s("line", { x1: M.left, x2: M.left + f.iw, y1: yy, y2: yy }, g);
      const t = s("text", { x: M.left - 8, y: yy + 3.5, "text-anchor": "end", class: "tick" }, a);
      t.textContent = yFormat(v);
    }
    s("line", { class: "axis-line", x1: M.left, x2: M.left + f.iw, y1: f.top + f.ih, y2: f.top + f.ih }, svg);
  }

  function xLabels(svg, f, items) {
    const a = s("g", { class: "axis" }, svg);
    let lastRight = -Infinity;
    for (const [x, text] of items) {
      const w = text.length * 6.2;
      if (x - w / 2 < lastRight + 6) continue;
      const t = s("text", { x, y: f.top + f.ih + 18, "text-anchor": "middle", class: "tick" }, a);
      t.textContent = text;
      lastRight = x + w / 2;
    }
  }

  function legend(container, series, extra) {
    const items = series.map((ser) => {
      const sw = PG.h("span", { class: "sw" });
      sw.style.background = ser.color;
      return PG.h("span", {}, sw, ser.name);
    });
    container.appendChild(PG.h("div", { class: "legend" }, items, extra || []));
  }

  function tooltip(container) {
    const tip = PG.h("div", { class: "tooltip", hidden: true });
    container.appendChild(tip);
    return {
      show(x, y, title, rows) {
        tip.replaceChildren(PG.h("div", { class: "t", text: title }), ...rows.map(([c, label, value]) => {
          const sw = PG.h("span", { class: "sw" });
          sw.style.background = c;
          return PG.h("div", {}, sw, `${label}: `, PG.h("b", { text: value }));
        }));
        tip.hidden = false;
        const cw = container.clientWidth;
        const left = x + 14 + tip.offsetWidth > cw ? x - 14 - tip.offsetWidth : x + 14;
        tip.style.left = `${Math.max(0, left)}px`;
        tip.style.top = `${Math.max(0, y)}px`;
      },
      hide() { tip.hidden = true; },
    };
  }

  // Redraw on resize (width only).
  function responsive(container, draw) {
    let width = container.clientWidth;
    draw();
    if (typeof ResizeObserver === "undefined") return;
    let timer = null;
    new ResizeObserver(() => {
      if (container.clientWidth === width) return;
      width = container.clientWidth;
      clearTimeout(timer);
      timer = setTimeout(draw, 120);
    }).observe(container);
  }

  function hover(svg, f, n, xOf, onIndex, onLeave) {
    const line = s("line", { class: "hover-line", y1: f.top, y2: f.top + f.ih, visibility: "hidden" }, svg);
    const rect = s("rect", { x: M.left, y: f.top, width: f.iw, height: f.ih, fill: "transparent" }, svg);
    rect.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const px = (ev.clientX - box.left) * (f.width / box.width);
      let best = 0, dist = Infinity;
      for (let i = 0; i < n; i++) {
        const d = Math.abs(xOf(i) - px);
        if (d < dist) { dist = d; best = i; }
      }
      line.setAttribute("x1", xOf(best)); line.setAttribute("x2", xOf(best));
      line.setAttribute("visibility", "visible");
      onIndex(best, xOf(best) * (box.width / f.width), (ev.clientY - box.top));
    });
    rect.addEventListener("mouseleave", () => { line.setAttribute("visibility", "hidden"); onLeave(); });
  }

  /* Lines over time. opts: {t: [start...], step, series: [{name, values}], yFormat, yMax, height} */
  function line(container, opts) {
    const series = opts.series.map((ser, i) => ({ ...ser, color: ser.color || color(i, ser.name) }));
    container.classList.add("chart");
    responsive(container, () => {
      container.replaceChildren();
      const f = frame(container, opts.height || 240);
      const n = opts.t.length;
      const t0 = opts.t[0], t1 = opts.t[n - 1] + opts.step;
      const x = (t) => M.left + ((t - t0) / (t1 - t0)) * f.iw;
      const xi = (i) => x(opts.t[i] + opts.step / 2);
      let max = opts.yMax;
      if (max === undefined) {
        max = 0;
        for (const ser of series) for (const v of ser.values) if (v !== null && v > max) max = v;
      }
      const yt = opts.yMax !== undefined ? { max: opts.yMax, ticks: opts.yTicks || yTicks(opts.yMax).ticks } : yTicks(max);
      const y = (v) => f.top + f.ih - (v / yt.max) * f.ih;
      yAxis(f.svg, f, yt.ticks, opts.yFormat, y);
      const tt = timeTicks(t0, t1);
      xLabels(f.svg, f, tt.ticks.map((t) => [x(t), tt.label(t)]));
      const plot = s("g", { class: "series" }, f.svg);
      for (const ser of series) {
        let d = "", pen = false, count = 0;
        ser.values.forEach((v, i) => {
          if (v === null || v === undefined) return; // gaps are bridged: a rate has no zero
          d += `${pen ? "L" : "M"}${xi(i).toFixed(1)},${y(v).toFixed(1)}`;
          pen = true; count++;
        });
        s("path", { d, fill: "none", stroke: ser.color, "stroke-width": 2, "stroke-linejoin": "round", "stroke-linecap": "round", class: "series-line", "data-series": ser.name, "stroke-dasharray": ser.dash || null }, plot);
        if (count <= 80) {
          ser.values.forEach((v, i) => {
            if (v === null || v === undefined) return;
            s("circle", { cx: xi(i), cy: y(v), r: 2.6, fill: "#fff", stroke: ser.color, "stroke-width": 1.6, class: "point" }, plot);
          });
        }
      }
      const tip = tooltip(container);
      hover(f.svg, f, n, xi, (i, px, py) => {
        const rows = series.filter((ser) => ser.values[i] !== null && ser.values[i] !== undefined)
          .map((ser) => [ser.color, ser.name, (opts.tipFormat || opts.yFormat)(ser.values[i], ser, i)]);
        if (!rows.length) { tip.hide(); return; }
        tip.show(px, py, PG.fmt.time(opts.t[i]) + " UTC", rows);
      }, () => tip.hide());
      container.prepend(f.svg);
      legend(container, series);
    });
  }

  /* Stacked columns over time. opts: {t, step, series: [{name, values}], yFormat, height} */
  function bars(container, opts) {
    const series = opts.series.map((ser, i) => ({ ...ser, color: ser.color || color(i, ser.name) }));
    container.classList.add("chart");
    responsive(container, () => {
      container.replaceChildren();
      const f = frame(container, opts.height || 200);
      const n = opts.t.length;
      const totals = opts.t.map((_, i) => series.reduce((a, ser) => a + (ser.values[i] || 0), 0));
      const yt = yTicks(Math.max(...totals, 0));
      const y = (v) => f.top + f.ih - (v / yt.max) * f.ih;
      yAxis(f.svg, f, yt.ticks, opts.yFormat, y);
      const bw = f.iw / n;
      const xi = (i) => M.left + bw * (i + 0.5);
      const tt = timeTicks(opts.t[0], opts.t[n - 1] + opts.step);
      const x = (t) => M.left + ((t - opts.t[0]) / (opts.step * n)) * f.iw;
      xLabels(f.svg, f, tt.ticks.map((t) => [x(t), tt.label(t)]));
      const g = s("g", { class: "series" }, f.svg);
      const gap = Math.min(2, bw * 0.2);
      for (let i = 0; i < n; i++) {
        let base = 0;
        for (const ser of series) {
          const v = ser.values[i] || 0;
          if (!v) continue;
          const top = y(base + v), bottom = y(base);
          s("rect", { x: M.left + bw * i + gap / 2, y: top, width: Math.max(1, bw - gap), height: Math.max(0.5, bottom - top), fill: ser.color, class: "bar", "data-series": ser.name }, g);
          base += v;
        }
      }
      const tip = tooltip(container);
      hover(f.svg, f, n, xi, (i, px, py) => {
        const rows = series.filter((ser) => ser.values[i]).map((ser) => [ser.color, ser.name, opts.yFormat(ser.values[i])]);
        if (!rows.length) { tip.hide(); return; }
        tip.show(px, py, PG.fmt.time(opts.t[i]) + " UTC", rows);
      }, () => tip.hide());
      container.prepend(f.svg);
      legend(container, series);
    });
  }

  /* Histogram of token counts. opts: {width, bins: [count], ghost: [count], markers: [{value, label}], color, height} */
  function histogram(container, opts) {
    container.classList.add("chart");
    responsive(container, () => {
      container.replaceChildren();
      const f = frame(container, opts.height || 230, 16);
      const n = Math.max(opts.nBins || 0, opts.bins.length, (opts.ghost || []).length, 1);
      const maxTok = n * opts.width;
      const x = (tok) => M.left + (tok / maxTok) * f.iw;
      const maxCount = Math.max(...opts.bins, ...(opts.ghost || []), 1);
      const yt = yTicks(maxCount);
      const y = (v) => f.top + f.ih - (v / yt.max) * f.ih;
      yAxis(f.svg, f, yt.ticks.filter((v) => Number.isInteger(v)), (v) => PG.fmt.int(v), y);
      const step = niceStep(maxTok, 6);
      const labels = [];
      for (let v = 0; v <= maxTok + 1e-9; v += step) labels.push([x(v), PG.fmt.tok(v)]);
      xLabels(f.svg, f, labels);
      const g = s("g", { class: "series" }, f.svg);
      const bw = f.iw / n;
      const gap = Math.min(1.5, bw * 0.15);
      (opts.ghost || []).forEach((c, i) => {
        if (!c) return;
        s("rect", { x: M.left + bw * i + gap / 2, y: y(c), width: Math.max(1, bw - gap), height: f.top + f.ih - y(c), fill: "none", stroke: "#cbd5e1", "stroke-width": 1, class: "ghost" }, g);
      });
      opts.bins.forEach((c, i) => {
        if (!c) return;
        const pinned = (opts.markers || []).some((m) => m.value >= i * opts.width && m.value < (i + 1) * opts.width);
        s("rect", {
          x: M.left + bw * i + gap / 2, y: y(c), width: Math.max(1, bw - gap), height: Math.max(0.5, f.top + f.ih - y(c)),
          fill: pinned ? "#b91c1c" : (opts.color || "#0f766e"), class: "bar" + (pinned ? " pinned" : ""),
          "data-lo": i * opts.width, "data-count": c, rx: Math.min(2, bw / 4),
        }, g);
      });
      for (const m of opts.markers || []) {
        const mx = x(m.value);
        s("line", { class: "marker-line", x1: mx, x2: mx, y1: f.top - 2, y2: f.top + f.ih, "data-value": m.value }, f.svg);
        const right = mx > M.left + f.iw * 0.62;
        const t = s("text", { class: "marker-label", x: right ? mx + 4 : mx - 4, y: f.top - 6, "text-anchor": right ? "end" : "start" }, f.svg);
        t.textContent = m.label;
      }
      const tip = tooltip(container);
      hover(f.svg, f, n, (i) => M.left + bw * (i + 0.5), (i, px, py) => {
        const rows = [["#0f766e", "requests with this cached length", PG.fmt.int(opts.bins[i] || 0)]];
        if (opts.ghost) rows.push(["#cbd5e1", "requests with this prompt length", PG.fmt.int(opts.ghost[i] || 0)]);
        tip.show(px, py, `${PG.fmt.int(i * opts.width)} – ${PG.fmt.int((i + 1) * opts.width)} tokens`, rows);
      }, () => tip.hide());
      container.prepend(f.svg);
      const sw = (cls, bg) => { const e = PG.h("span", { class: "sw " + cls }); if (bg) e.style.background = bg; return e; };
      container.appendChild(PG.h("div", { class: "legend" },
        PG.h("span", {}, sw("", opts.color || "#0f766e"), "cached tokens"),
        opts.ghost ? PG.h("span", {}, sw("ghost"), "prompt tokens") : null,
        (opts.markers || []).length ? PG.h("span", {}, sw("dash"), "pinned constant") : null));
    });
  }

  return { line, bars, histogram, color, PALETTE };
})();
