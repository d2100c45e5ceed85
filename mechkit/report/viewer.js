/* mechkit views: layer × head grids and attention patterns, drawn as plain SVG.
 *
 * Embedded inline in report.html and in notebook output. No library, no network, no fonts: every
 * view (a div.mk-view) reads its spec from the JSON script block inside it, and the patterns a grid
 * opens from the JSON block marked data-mk-patterns=KEY in the same page or notebook output
 * (mechkit.patterns/v1: see mechkit/report/patterns.py). Running it twice (two notebook outputs) is
 * harmless: a view already drawn is marked data-ready and skipped.
 */
(function () {
  "use strict";
  // The SVG namespace, read from a parsed <svg>: the page then holds no URL at all, not even this one.
  const NS = (d => { d.innerHTML = "<svg></svg>"; return d.firstChild.namespaceURI; })(document.createElement("div"));
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

  function el(tag, attrs, parent, text) {
    const node = tag === "div" || tag === "span" || tag === "select" || tag === "option"
      ? document.createElement(tag) : document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function mix(a, b, t) {
    return "rgb(" + a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",") + ")";
  }

  // Viridis over the grid's range, as the PNG beside it is drawn; blank cells light grey.
  function colourScale(values) {
    const flat = values.flat().filter(v => v !== null);
    const lo = Math.min(...flat), hi = Math.max(...flat);
    return v => {
      if (v === null) return "#eee";
      const t = hi > lo ? (v - lo) / (hi - lo) : 1, i = Math.min(3, Math.floor(t * 4));
      return mix(VIRIDIS[i], VIRIDIS[i + 1], t * 4 - i);
    };
  }

  function bytes(b64) {
    return Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  }

  // mechkit.patterns/v1 -> {tokens, heads, row(i, t)}: row t of head i, keys 0..t.
  function decode(p) {
    const q = bytes(p.data), peaks = new DataView(bytes(p.row_max).buffer), T = p.n_tokens;
    const per = T * (T + 1) / 2;
    return {
      tokens: p.tokens, heads: p.heads, T: T,
      index: new Map(p.heads.map((h, i) => [h[0] + "." + h[1], i])),
      row(i, t) {
        const off = i * per + t * (t + 1) / 2, m = peaks.getUint16((i * T + t) * 2, true) / 65535;
        return Array.from(q.subarray(off, off + t + 1), b => b / 255 * m);
      },
    };
  }

  function label(tok) {
    const s = tok.replace(/\n/g, "\u21b5").replace(/\s/g, "\u00b7");
    return s.length > 9 ? s.slice(0, 8) + "\u2026" : s;
  }

  // The layer × head grid: hover calls onHover(name | null), a click onPick(name).
  function drawGrid(box, g, onHover, onPick) {
    const L = g.values.length, H = g.values[0].length, left = 26, top = 16;
    const c = Math.max(8, Math.min(22, Math.floor(420 / L), Math.floor(300 / H)));
    const colour = colourScale(g.values), marked = new Set((g.highlight || []).map(h => h[0] + "." + h[1]));
    const svg = el("svg", {class: "mk-grid", width: left + H * c + 2, height: top + L * c + 2}, box);
    for (let h = 0; h < H; h++) {
      if (H <= 40 || h % 5 === 0) el("text", {x: left + h * c + c / 2, y: 11, "text-anchor": "middle"}, svg, h);
    }
    for (let l = 0; l < L; l++) {
      if (L <= 40 || l % 5 === 0) el("text", {x: left - 4, y: top + l * c + c * 0.75, "text-anchor": "end"}, svg, l);
      for (let h = 0; h < H; h++) {
        const v = g.values[l][h], name = l + "." + h;
        const r = el("rect", {x: left + h * c, y: top + l * c, width: c, height: c, fill: colour(v),
                              "data-head": name, "data-value": v === null ? "" : v}, svg);
        if (marked.has(name)) r.setAttribute("class", "mk-marked");
        r.addEventListener("mouseenter", () => onHover(name, v));
        r.addEventListener("click", () => onPick(name));
      }
    }
    svg.addEventListener("mouseleave", () => onHover(null));
    return svg;
  }

  // One head's pattern, query rows × key columns, lower triangle; a dot marks each query's top source.
  function drawPattern(box, P, onQuery) {
    const T = P.T, c = Math.max(4, Math.min(16, Math.floor(420 / T))), left = 64, top = 4;
    const every = c >= 8 ? 1 : Math.ceil(8 / c);
    const svg = el("svg", {class: "mk-pattern", width: left + T * c + 4, height: top + T * c + 66}, box);
    const cells = [], dots = [];
    for (let t = 0; t < T; t++) {
      if (t % every === 0) {
        el("text", {x: left - 3, y: top + t * c + c * 0.8, "text-anchor": "end"}, svg, label(P.tokens[t]));
        const x = left + t * c + c * 0.7, y = top + T * c + 4;
        el("text", {x: x, y: y, "text-anchor": "end", transform: `rotate(-60 ${x} ${y})`}, svg, label(P.tokens[t]));
      }
      cells.push([]);
      for (let s = 0; s <= t; s++) {
        const r = el("rect", {x: left + s * c, y: top + t * c, width: c, height: c, "data-q": t, "data-k": s,
                              fill: "#3b6fd6", "fill-opacity": 0}, svg);
        r.addEventListener("click", () => onQuery(t));
        cells[t].push(r);
      }
      dots.push(el("circle", {r: Math.max(1.2, c * 0.2), fill: "#e8590c", cy: top + t * c + c / 2}, svg));
    }
    el("rect", {x: left, y: top, width: T * c, height: T * c, fill: "none", stroke: "#ccc"}, svg);
    return {
      svg,
      show(i) {
        svg.setAttribute("data-head", P.heads[i][0] + "." + P.heads[i][1]);
        for (let t = 0; t < T; t++) {
          const row = P.row(i, t);
          let best = 0;
          row.forEach((p, s) => { cells[t][s].setAttribute("fill-opacity", p.toFixed(4)); if (p > row[best]) best = s; });
          dots[t].setAttribute("cx", left + best * c + c / 2);
          dots[t].setAttribute("data-k", best);
        }
      },
    };
  }

  // The prompt as text, one line per head: each token tinted by that head's attention from query q.
  function drawText(box, P, order, q, onQuery) {
    box.textContent = "";
    for (const i of order) {
      const line = el("div", {class: "mk-line"}, box);
      el("span", {class: "mk-who"}, line, P.heads[i][0] + "." + P.heads[i][1]);
      const row = P.row(i, q);
      P.tokens.forEach((tok, s) => {
        const a = s <= q ? row[s] : 0;
        const span = el("span", {class: s === q ? "mk-tok mk-q" : "mk-tok", "data-k": s}, line, tok);
        span.style.background = `rgba(59,111,214,${a.toFixed(3)})`;
        span.title = `${P.heads[i][0]}.${P.heads[i][1]}: ${a.toFixed(3)}`;
        span.addEventListener("click", () => onQuery(s));
      });
    }
  }

  function fmt(v) {
    return v === null || v === undefined || v === "" ? "—" : Math.abs(v) >= 100 ? v.toFixed(0) : (+v).toPrecision(3);
  }

  function render(root) {
    root.setAttribute("data-ready", "1");
    const spec = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    const scope = root.closest(".mk-scope") || document;
    let raw = spec.patterns;
    if (typeof raw === "string") {
      const block = scope.querySelector(`script[data-mk-patterns="${raw}"]`);
      raw = block ? JSON.parse(block.textContent) : null;
    }
    const P = raw ? decode(raw) : null, g = spec.grid;
    const info = el("div", {class: "mk-info"}, root, "\u00a0");
    const body = el("div", {class: "mk-panels"}, root);
    let pinned = spec.pick || (P ? P.heads[0][0] + "." + P.heads[0][1] : null), query = P ? P.T - 1 : 0;
    let pattern = null, select = null, text = null, title = null, lines = [];
    const valueOf = name => { if (!g) return null; const [l, h] = name.split(".").map(Number); return g.values[l][h]; };
    const say = name => {
      info.textContent = name === null ? "\u00a0"
        : `head ${name}` + (g ? ` \u00b7 ${g.label}: ${fmt(valueOf(name))}` : "")
          + (P && !P.index.has(name) ? " \u00b7 no pattern recorded" : "");
    };
    const show = name => {
      if (!P || !P.index.has(name)) return;
      if (name === pinned) mark();
      const i = P.index.get(name);
      pattern.show(i);
      title.textContent = `head ${name}: where each query (row) attends (column); \u25cf its top source`;
      if (select) select.value = name;
      if (text) drawText(text, P, [i, ...lines.filter(j => j !== i)].slice(0, 8), query, setQuery);
    };
    const setQuery = t => { query = t; show(pinned); };
    if (g) {
      const gbox = el("div", {class: "mk-panel"}, body);
      el("div", {class: "mk-title"}, gbox, g.title);
      drawGrid(gbox, g, (name, v) => {
        say(name);
        show(name !== null && P && P.index.has(name) ? name : pinned);
      }, name => { if (P && P.index.has(name)) { pinned = name; show(name); } say(name); });
    }
    const mark = () => root.querySelectorAll("svg.mk-grid rect").forEach(r =>
      r.classList.toggle("mk-pinned", r.dataset.head === pinned));
    if (P) {
      const pbox = el("div", {class: "mk-panel"}, body);
      if (spec.text) {
        select = el("select", {"aria-label": "head"}, pbox);
        for (const h of P.heads) el("option", {value: h[0] + "." + h[1]}, select, "head " + h[0] + "." + h[1]);
        select.addEventListener("change", () => { pinned = select.value; say(pinned); show(pinned); });
      }
      title = el("div", {class: "mk-title"}, pbox);
      pattern = drawPattern(pbox, P, setQuery);
      if (spec.text) {
        lines = spec.text === true ? P.heads.map((h, i) => i)
          : spec.text.map(name => P.index.get(name)).filter(i => i !== undefined);
        el("div", {class: "mk-title"}, root, "The prompt: click a token to make it the query; each line is one " +
           "head, tinted by its attention from the query (outlined).");
        text = el("div", {class: "mk-text"}, root);
      }
      show(pinned);
    }
  }

  function renderAll() {
    document.querySelectorAll(".mk-view:not([data-ready])").forEach(root => {
      try { render(root); } catch (err) { root.textContent = "mechkit view failed: " + err; throw err; }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
})();
