// A display equation a little wider than its column (at most 18 %) is set in a smaller font
// until it fits, instead of getting a horizontal scrollbar. Wider ones are broken into lines in
// the chapter itself; tools/page_check.py fails on any that still overflows.
(function () {
  const MIN_SCALE = 0.82;
  function fit() {
    for (const eq of document.querySelectorAll('mjx-container[display="true"]')) {
      eq.style.fontSize = '';
      const need = eq.scrollWidth, have = eq.clientWidth;
      if (need <= have + 1 || have === 0) continue;
      const scale = have / need;
      if (scale >= MIN_SCALE) eq.style.fontSize = (Math.floor(scale * 1000) / 10) + '%';
    }
    document.documentElement.dataset.mathFitted = 'yes';
  }
  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit);
    } else {
      setTimeout(whenTypeset, 50);
    }
  }
  window.addEventListener('load', whenTypeset);
  let timer = null;
  window.addEventListener('resize', () => { clearTimeout(timer); timer = setTimeout(fit, 200); });
})();
