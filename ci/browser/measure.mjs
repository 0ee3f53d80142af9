// Loads report pages in a real headless Chromium at each viewport and prints, as one JSON line, what
// tests/test_report_browser.py judges: horizontal overflow, each plot's size, where the first failing check sits,
// whether the grid's first failing cell is on the screen without a sideways scroll, the smallest text on the page;
// saves a screenshot of each, the whole page and its first screen.
// Usage: node ci/browser/measure.mjs CHROMIUM SCREENSHOT_DIR WIDTHxHEIGHT[,WIDTHxHEIGHT...] PAGE.html...
import path from "node:path";
import { pathToFileURL } from "node:url";
import puppeteer from "puppeteer-core";

const [executablePath, screenshots, viewports, ...pages] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath, headless: "shell", args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const results = [];
try {
  const page = await browser.newPage();
  for (const file of pages) {
    for (const size of viewports.split(",")) {
      const [width, height] = size.split("x").map(Number);
      await page.setViewport({ width, height, isMobile: width < 600, hasTouch: width < 600 });
      await page.goto(pathToFileURL(path.resolve(file)).href, { waitUntil: "load" });
      const measured = await page.evaluate(() => {
        const box = (element) => {
          const r = element.getBoundingClientRect();
          return { top: r.top + scrollY, bottom: r.bottom + scrollY, width: r.width, height: r.height };
        };
        let smallest = { size: Infinity, text: "" };
        const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
          const element = node.parentElement;
          if (!node.textContent.trim() || element.closest("title")) continue;
          const style = getComputedStyle(element);
          if (style.display === "none" || style.visibility === "hidden") continue;
          // SVG text is scaled with its SVG: its size on screen is its font size times the scale
          const scale = element instanceof SVGElement ? element.getScreenCTM().a : 1;
          const size = parseFloat(style.fontSize) * scale;
          if (size < smallest.size) smallest = { size, text: node.textContent.trim().slice(0, 60) };
        }
        const failing = document.querySelector("#needs-attention li");
        // the grid's failing cells as this width shows them (the table's, or on a phone the cards): is each on the
        // screen without a sideways scroll? The window scrolled down to it (never sideways, nor any box in it), its box
        // must lie within the window and be what is drawn at its place.
        const failingCells = [...document.querySelectorAll(
          '#grid .grid-entry[data-word="fail"], #grid .grid-entry[data-word="error"], #grid .grid-entry[data-word="missing"]')]
          .filter((element) => element.getClientRects().length > 0).slice(0, 20).map((element) => {
            window.scrollTo(0, element.getBoundingClientRect().top + scrollY - innerHeight / 3);
            const r = element.getBoundingClientRect();
            const x = Math.min(Math.max(r.left + 4, 0), innerWidth - 1);
            const hit = document.elementFromPoint(x, Math.min(Math.max(r.top + 4, 0), innerHeight - 1));
            return { cell: element.dataset.cell, word: element.dataset.word, left: r.left, right: r.right,
                     drawn: !!hit && element.contains(hit), scrollX };
          });
        window.scrollTo(0, 0);
        return {
          innerWidth, innerHeight, scrollWidth: document.documentElement.scrollWidth, failingCells,
          plots: [...document.querySelectorAll("svg.plot")].map((svg) => ({
            label: svg.getAttribute("aria-label"), ...box(svg) })),
          firstFailing: failing && { text: failing.textContent.slice(0, 120), ...box(failing) },
          smallestText: smallest,
        };
      });
      const screenshot = path.join(screenshots, `${path.basename(file, ".html")}-${width}.png`);
      const firstScreen = screenshot.replace(/\.png$/, "-first-screen.png");
      await page.screenshot({ path: screenshot, fullPage: true });
      await page.screenshot({ path: firstScreen });
      results.push({ page: file, width, height, screenshot, firstScreen, ...measured });
    }
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(results));
