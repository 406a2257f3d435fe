// The dashboard's panels reload themselves every LOCKS_UI_REFRESH. A click is a press and a
// release on the same element: a reload swapped in between, whether it replaces the pressed
// button or only moves it (a panel above grew or shrank), sends the release elsewhere and
// drops the click (an operator's Re-enable or Resend that silently did nothing). While a
// pointer is pressed, no reload is swapped in; the next one after the release is.
(function () {
  "use strict";
  let pressed = false;
  const release = () => { pressed = false; };
  document.addEventListener("pointerdown", () => { pressed = true; }, true);
  document.addEventListener("pointerup", release, true);
  document.addEventListener("pointercancel", release, true);
  document.addEventListener("htmx:beforeSwap", (e) => {
    const d = e.detail;
    if (pressed && d.requestConfig && d.requestConfig.verb === "get") {
      d.shouldSwap = false;
    }
  });
})();
