// Builds the dashboard UI into web/dist: one classic (IIFE) script and one
// stylesheet with relative paths, so the same files are served by the backend
// and open from disk (file://) in a static export.
import { build } from 'esbuild';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, 'dist');
await rm(dist, { recursive: true, force: true });
await mkdir(join(dist, 'assets'), { recursive: true });
await build({
  entryPoints: [join(here, 'src', 'main.js')],
  bundle: true,
  format: 'iife',
  minify: true,
  sourcemap: false,
  target: ['es2020'],
  legalComments: 'linked',
  outfile: join(dist, 'assets', 'app.js'),
  logLevel: 'warning',
});
await build({
  entryPoints: [join(here, 'src', 'style.css')],
  bundle: true,
  minify: true,
  outfile: join(dist, 'assets', 'app.css'),
  logLevel: 'warning',
});
await writeFile(join(dist, 'index.html'), await readFile(join(here, 'src', 'index.html'), 'utf8'));
console.log(`built ${dist}`);
