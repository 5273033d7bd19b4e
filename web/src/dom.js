// Tiny DOM helpers: h('div.cls', {attrs}, children...) and formatting.

export function h(tag, attrs, ...children) {
  const [name, ...classes] = tag.split('.');
  const el = document.createElement(name || 'div');
  if (classes.length) el.className = classes.join(' ');
  if (attrs !== null && attrs !== undefined && (typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function fmt(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return v.toLocaleString('en');
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return v.toFixed(digits).replace(/\.?0+$/, '') || '0';
}

// A chart axis tick as people write numbers: 0.25, 1,200, 4.5e-6 (Chart.js's own
// labels turn small axes into 4.50000000E-6). Four significant digits drop float noise.
export function tickLabel(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return String(v);
  if (v === 0) return '0';
  const n = Number(v.toPrecision(4));
  const a = Math.abs(n);
  if (a < 1e-3 || a >= 1e6) return n.toExponential().replace('e+', 'e');
  return n.toLocaleString('en', { maximumFractionDigits: 6 });
}

export function pct(v) {
  return v === null || v === undefined ? '—' : `${(v * 100).toFixed(0)}%`;
}

export function seconds(v) {
  if (v === null || v === undefined) return '—';
  return v >= 100 ? `${v.toFixed(0)} s` : `${v.toFixed(2)} s`;
}

export function panel(id, title, ...body) {
  return h('section.panel', { 'data-panel': id, id: `panel-${id}` }, h('h2', title), h('div.body', body));
}

export function empty(text) {
  return h('p.empty', text);
}

// Object keyed by step (JSON keys are strings) -> sorted numeric steps.
export function steps(obj) {
  return Object.keys(obj || {})
    .map(Number)
    .sort((a, b) => a - b);
}
