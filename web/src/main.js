// Entry point: routes by path (served) or by hash (static export, file://).
import { HttpError, isStatic, links, staticData } from './api.js';
import { h } from './dom.js';
import { renderCompare } from './views/compare.js';
import { follow, renderRun } from './views/run.js';
import { renderRuns } from './views/runs.js';
import { renderTrajectory } from './views/trajectory.js';

let unsubscribe = () => {};

function nav() {
  const el = document.getElementById('nav');
  if (isStatic) {
    const s = staticData();
    el.replaceChildren(h('a', { href: '#/' }, 'Run'), h('span.note', ` static export of ${s.run_id}, ${new Date(s.exported_at * 1000).toISOString().slice(0, 16)}`));
    document.getElementById('brand').setAttribute('href', '#/');
  } else {
    el.replaceChildren(h('a', { href: links.runs() }, 'Runs'), h('a', { href: links.compare() }, 'Compare'));
  }
}

async function route() {
  unsubscribe();
  unsubscribe = () => {};
  const view = document.getElementById('view');
  try {
    if (isStatic) {
      const s = staticData();
      const m = window.location.hash.match(/^#\/trajectories\/(.+)$/);
      if (m) await renderTrajectory(view, s.run_id, decodeURIComponent(m[1]));
      else await renderRun(view, s.run_id);
      return;
    }
    const path = window.location.pathname.replace(/\/+$/, '') || '/';
    let m;
    if ((m = path.match(/^\/runs\/([^/]+)\/trajectories\/([^/]+)$/))) {
      await renderTrajectory(view, decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    } else if ((m = path.match(/^\/runs\/([^/]+)$/))) {
      const runId = decodeURIComponent(m[1]);
      const run = await renderRun(view, runId);
      unsubscribe = follow(view, runId, run);
    } else if (path === '/compare') {
      await renderCompare(view);
    } else {
      await renderRuns(view);
    }
  } catch (e) {
    const status = e instanceof HttpError ? e.status : 0;
    view.replaceChildren(h('div.problems', { 'data-error': status }, h('strong', status === 404 ? 'Not found' : 'Could not load'), h('p', e.message)));
    console.error(e);
  }
}

nav();
window.addEventListener('hashchange', route);
route();
