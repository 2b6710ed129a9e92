// screenshots.mjs: photographs the console's main pages for the README, in
// Chinese and English, 1366 (laptop) and 390 (phone) pixels wide, against
// the gpurentd screenshots.py started (its facts in CONSOLE_WORLD).
import { chromium } from "playwright-core";

const world = JSON.parse(process.env.CONSOLE_WORLD);
const base = world.base_url;
const SIZES = { laptop: { width: 1366, height: 900 }, phone: { width: 390, height: 844 } };
const PAGES = [
  ["login", null, "#/login", "#login-email"],
  ["overview", "user", "#/overview", "#available"],
  ["catalog", "user", "#/catalog", "table"],
  ["launch", "user", "#/launch", "#estimate-hour"],
  ["instance", "user", `#/instances/${world.instance_id}`, "#ssh-0"],
  ["usage", "user", "#/usage", "#spend-chart"],
  ["nodes", "admin", "#/admin/nodes", ".node-state"],
  ["reservations", "user", `#/reservations?gpu_type=H100-SXM&from=${world.reservations_from}`, "#availability .bar"],
  ["apps", "user", "#/apps", "#apps table"],
  ["app", "user", `#/apps/${world.app_slug}`, "#app-stats"],
].filter(([name]) => !process.env.SHOTS || process.env.SHOTS.split(",").includes(name));

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
try {
  for (const lang of ["zh", "en"]) {
    for (const [size, viewport] of Object.entries(SIZES)) {
      for (const [name, who, hash, ready] of PAGES) {
        const context = await browser.newContext({ viewport, deviceScaleFactor: 1, timezoneId: "Asia/Shanghai" });
        await context.addInitScript((l) => localStorage.setItem("gpurent.lang", l), lang);
        const page = await context.newPage();
        if (who) {
          await page.goto(`${base}/console#/login`);
          await page.fill("#login-email", world[who]);
          await page.fill("#login-password", world.password);
          await page.click("#login-submit");
          await page.waitForFunction(() => !location.hash.startsWith("#/login"));
        }
        await page.goto(`${base}/console${hash}`);
        await page.waitForSelector(ready, { timeout: 30000 });
        await page.waitForLoadState("networkidle").catch(() => {});
        const file = `${world.outdir}/${name}-${lang}-${size}.png`;
        await page.screenshot({ path: file });
        process.stdout.write(`${file}\n`);
        await context.close();
      }
    }
  }
} finally {
  await browser.close();
}
