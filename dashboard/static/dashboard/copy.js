/* Copy-to-clipboard for buttons with data-copy="#input-id"; they stay hidden without JavaScript,
   where the key is still selectable in its read-only field. */
(function () {
  "use strict";

  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var target = document.querySelector(button.dataset.copy);
    if (!target) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      var done = function () {
        button.textContent = "Copied";
        setTimeout(function () { button.textContent = "Copy"; }, 2000);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(target.value).then(done, function () {
          target.select();
          document.execCommand("copy");
          done();
        });
      } else {
        target.select();
        document.execCommand("copy");
        done();
      }
    });
  });
})();
