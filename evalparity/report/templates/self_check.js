// The page checks itself once loaded: a figure that failed to decode is logged as a console error, which is
// what the headless-browser test (and anyone opening the developer console) sees.
window.addEventListener('load', function () {
  document.querySelectorAll('img').forEach(function (i) {
    if (!(i.complete && i.naturalWidth > 0)) {
      console.error('missing image: ' + i.alt);
    }
  });
});
