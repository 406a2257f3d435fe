// The dashboard's panels reload themselves every LOCKS_UI_REFRESH. A reload swapped in while
// someone is about to click replaces the button under the pointer or moves it (a panel above
// grew or shrank), and the click is lost or lands on something else: an operator's Re-enable
// or Resend that silently did nothing. So reloads (GETs) are not swapped in while a pointer is
// pressed, nor for a moment after it comes to rest on a control, until it clicks there; the
// next reload after that is swapped in.
(function () {
  "use strict";
  // How long a pointer resting on a control holds the reloads: time to click it, short
  // enough that a pointer left on a button does not freeze the page.
  const restHoldMs = 2000;
  let pressed = false;
  let control = null; // the control under the pointer, if any
  let restUntil = 0;
  const controlOf = (el) => (el instanceof Element ? el.closest("button, a, input, select, textarea, label, summary") : null);
  document.addEventListener("pointerover", (e) => {
    const c = controlOf(e.target);
    if (c !== control) {
      control = c;
      restUntil = c ? Date.now() + restHoldMs : 0;
    }
  }, true);
  document.addEventListener("pointerout", (e) => {
    if (e.relatedTarget === null) {
      control = null;
      restUntil = 0;
    }
  }, true);
  document.addEventListener("pointerdown", () => { pressed = true; }, true);
  const release = () => {
    pressed = false;
    restUntil = 0; // clicked: the reloads may come again
  };
  document.addEventListener("pointerup", release, true);
  document.addEventListener("pointercancel", release, true);
  document.addEventListener("htmx:beforeSwap", (e) => {
    const d = e.detail;
    if (d.requestConfig && d.requestConfig.verb === "get" && (pressed || Date.now() < restUntil)) {
      d.shouldSwap = false;
    }
  });
})();
