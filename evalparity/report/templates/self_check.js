// The page checks itself once loaded, and logs what it finds to the console, which is what the headless-browser
// test (and anyone opening the developer console) sees: a figure that failed to decode, a page or a table wider
// than the window (a reader would have to scroll sideways), and where the sign-off ends (it belongs on the
// first screen).
window.addEventListener('load', function () {
  document.querySelectorAll('img').forEach(function (i) {
    if (!(i.complete && i.naturalWidth > 0)) {
      console.error('missing image: ' + i.alt);
    }
  });
  var page = document.documentElement;
  if (page.scrollWidth > page.clientWidth) {
    console.error('overflow: the page is ' + page.scrollWidth + ' px wide in a ' + page.clientWidth + ' px window');
  }
  document.querySelectorAll('.scroll').forEach(function (box) {
    if (box.scrollWidth > box.clientWidth) {
      var heads = Array.prototype.map.call(box.querySelectorAll('th'), function (th) { return th.textContent; });
      console.error('overflow: a table (' + heads.slice(0, 4).join(' | ') + ') needs ' + box.scrollWidth +
                    ' px in ' + box.clientWidth + ' px');
    }
  });
  var signOff = document.getElementById('sign-off');
  if (signOff) {
    console.info('layout: sign-off ends at ' + Math.ceil(signOff.getBoundingClientRect().bottom) + ' px in a ' +
                 window.innerWidth + ' x ' + window.innerHeight + ' px window');
  }
});
